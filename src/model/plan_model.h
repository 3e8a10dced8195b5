// model/plan_model.h — a model file seen by the layout cost model (parallel/planner.h): its
// shapes, and its tensors' bytes and FLOPs sorted into what tensor parallelism splits, what every
// rank keeps, the routed and shared experts, the embedding and the output projection.
#pragma once
#include <string>

#include "parallel/planner.h"

namespace fp {

// Layer matrices split, routed experts ("_exps") and shared experts ("_shexp") counted apart,
// routers and everything else replicated. The file is mapped, not read: only sizes are used.
PlanModel plan_model_from_file(const std::string& path);

}  // namespace fp
