// tools/main.cpp — the `fastpath` command: one binary, one subcommand per job.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "core/error.h"
#include "core/log.h"
#include "parallel/communicator.h"
#include "tools/common.h"

namespace {

// Runs the command; returns its exit status. `failed` is set when it ended in an error, which
// under mpirun must end every rank (close_world), not leave the others waiting in a collective.
int run(int argc, char** argv, bool& failed) {
  CLI::App app{"fastpath: LLM inference that shows which kernels ran and how close to the hardware's ceiling"};
  app.require_subcommand(1);
  fp::tools::add_generate(app);
  fp::tools::add_tokenize(app);
  fp::tools::add_logits(app);
  fp::tools::add_embed(app);
  fp::tools::add_inspect(app);
  fp::tools::add_synth(app);
  fp::tools::add_bench(app);
  fp::tools::add_audit(app);
  fp::tools::add_bench_serve(app);
  fp::tools::add_serve(app);
  fp::tools::add_plan(app);
  fp::tools::add_bench_comm(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const fp::Error& e) {
    fp::log_error(e.what());
    failed = true;
    return 1;
  } catch (const std::exception& e) {
    fp::log_error("unexpected error: ", e.what());
    failed = true;
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  bool failed = false;
  const int rc = run(argc, argv, failed);
  fp::close_world(!failed);
  return rc;
}
