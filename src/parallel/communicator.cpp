// parallel/communicator.cpp — the single-rank communicator, the world backends' registry and
// the process's world (open, current, close).
#include "parallel/communicator.h"

#include <cstdlib>
#include <cstring>
#include <map>

#include "core/error.h"

namespace fp {

void SingleCommunicator::all_gather(const void* send, void* recv, int64_t bytes) {
  if (send != recv) std::memmove(recv, send, static_cast<size_t>(bytes));
}

void SingleCommunicator::reduce_scatter_sum(const float* send, float* recv, int64_t n) {
  if (send != recv) std::memmove(recv, send, static_cast<size_t>(n) * sizeof(float));
}

void SingleCommunicator::all_to_all(const void* send, void* recv, int64_t bytes) { all_gather(send, recv, bytes); }

void SingleCommunicator::all_to_all_v(const void* send, const int64_t* send_bytes, void* recv, const int64_t* recv_bytes) {
  FP_CHECK(send_bytes[0] == recv_bytes[0], "all_to_all_v on one rank: sends ", send_bytes[0], " bytes but expects ",
           recv_bytes[0]);
  all_gather(send, recv, send_bytes[0]);
}

void SingleCommunicator::broadcast(void*, int64_t, int root) {
  FP_CHECK(root == 0, "broadcast from rank ", root, " on a single-rank communicator");
}

void SingleCommunicator::send(const void*, int64_t, int to) { fail("send to rank ", to, " on a single-rank communicator"); }
void SingleCommunicator::recv(void*, int64_t, int from) { fail("recv from rank ", from, " on a single-rank communicator"); }
void SingleCommunicator::abort(int code) { std::exit(code); }

namespace {

std::map<std::string, WorldFactory>& backends() {
  static std::map<std::string, WorldFactory> b;
  return b;
}

std::shared_ptr<Communicator>& world() {
  static std::shared_ptr<Communicator> w;
  return w;
}

// The first of the environment variables that is set, as an integer (or `fallback`).
int env_int(std::initializer_list<const char*> names, int fallback) {
  for (const char* n : names)
    if (const char* v = std::getenv(n); v && *v) return std::atoi(v);
  return fallback;
}

}  // namespace

bool register_world_backend(const std::string& name, WorldFactory factory) {
  backends()[name] = std::move(factory);
  return true;
}

bool has_world_backend(const std::string& name) { return backends().count(name) > 0; }

namespace {
std::map<std::string, DeviceCommFactory>& device_comms() {
  static std::map<std::string, DeviceCommFactory> m;
  return m;
}
}  // namespace

bool register_device_communicator(const std::string& device, DeviceCommFactory factory) {
  device_comms()[device] = std::move(factory);
  return true;
}

std::shared_ptr<Communicator> open_device_communicator(const std::string& device, std::shared_ptr<Communicator> host) {
  auto it = device_comms().find(device);
  FP_CHECK(it != device_comms().end(), "several ranks on --device ", device, " need a device communicator (NCCL for cuda), and this build has none");
  return it->second(std::move(host));
}

int launched_world_size() { return env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}, 1); }
int launched_local_size() { return env_int({"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}, 1); }
int launched_rank() { return env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}, 0); }

std::shared_ptr<Communicator> open_world(int tp_size, const char* flag) {
  FP_CHECK(tp_size >= 1, flag, " must be at least 1, got ", tp_size);
  auto& w = world();
  if (w) {
    FP_CHECK(w->size() == tp_size, flag, " ", tp_size, " but this process already runs with ",
             w->size(), " ranks");
    return w;
  }
  const int launched = launched_world_size();
  if (tp_size == 1) {
    FP_CHECK(launched == 1, "this process is one of ", launched, " ranks (mpirun -np ", launched,
             ") but ", flag, " is 1; pass ", flag, " ", launched, " or run without mpirun");
    w = std::make_shared<SingleCommunicator>();
    return w;
  }
  FP_CHECK(has_world_backend("mpi"), flag, " ", tp_size,
           " needs MPI, and this build has none (install libopenmpi-dev, reconfigure, and run under mpirun -np ",
           tp_size, ")");
  FP_CHECK(launched == tp_size, flag, " ", tp_size, " but the MPI world has ", launched,
           " rank(s); launch with mpirun -np ", tp_size);
  w = backends()["mpi"]();
  if (w->size() != tp_size) {  // the environment said one thing, MPI another
    const int n = w->size();
    close_world(false);
    fail(flag, " ", tp_size, " but the MPI world has ", n, " rank(s)");
  }
  return w;
}

Communicator* current_world() { return world().get(); }

void close_world(bool ok) {
  auto& w = world();
  if (!w) return;
  if (!ok && w->size() > 1) w->abort(1);
  w.reset();  // the last reference: the backend finalizes (MPI_Finalize)
}

}  // namespace fp
