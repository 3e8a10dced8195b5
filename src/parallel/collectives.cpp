// parallel/collectives.cpp — shape classes of the collective ops and their "single" and "ref"
// kernels (the "mpi" kernels are registered in mpi_communicator.cpp, built only with MPI).
#include "parallel/collectives.h"

#include <cstring>
#include <vector>

#include "core/error.h"
#include "kernels/registry.h"

namespace fp {

namespace {
std::string comm_class(const Communicator* c, const char* dtype) {
  FP_CHECK(c, "collective op called without a communicator");
  return std::string(dtype) + " comm=" + c->backend() + " ranks=" + std::to_string(c->size());
}
}  // namespace

std::string AllReduceArgs::shape_class() const { return comm_class(comm, "f32 sum"); }
std::string AllReduceStartArgs::shape_class() const { return comm_class(comm, "f32 sum"); }
std::string CollectiveWaitArgs::shape_class() const { return comm_class(comm, "started"); }
std::string AllGatherArgs::shape_class() const { return comm_class(comm, "bytes"); }
std::string AllGatherStartArgs::shape_class() const { return comm_class(comm, "bytes"); }
std::string ReduceScatterArgs::shape_class() const { return comm_class(comm, "f32 sum"); }
std::string ReduceScatterStartArgs::shape_class() const { return comm_class(comm, "f32 sum"); }
std::string AllToAllArgs::shape_class() const { return comm_class(comm, send_bytes ? "bytes v" : "bytes"); }
std::string BroadcastArgs::shape_class() const { return comm_class(comm, "bytes"); }

void wait_out(Communicator* comm, int64_t& handle) noexcept {
  try {
    if (comm && handle != Communicator::kDone) comm->wait(handle);
  } catch (...) {
    // The communicator failed too: nothing more to wait for.
  }
  handle = Communicator::kDone;
}

std::string refuse_unless_backend(const Communicator* comm, const char* backend) {
  if (std::strcmp(comm->backend(), backend) == 0) return "";
  return std::string("the communicator is ") + comm->backend() + ", not " + backend;
}

namespace {

// ---- reference kernels: blocking point-to-point messages, rank 0 as the hub ---------------

// Rank 0 receives every rank's data, adds them in rank order, and sends the sum back.
void all_reduce_ref(const AllReduceArgs& a) {
  Communicator& c = *a.comm;
  const int64_t bytes = a.n * static_cast<int64_t>(sizeof(float));
  if (c.rank() == 0) {
    std::vector<float> other(static_cast<size_t>(a.n));
    for (int r = 1; r < c.size(); ++r) {
      c.recv(other.data(), bytes, r);
      for (int64_t i = 0; i < a.n; ++i) a.data[i] += other[static_cast<size_t>(i)];
    }
    for (int r = 1; r < c.size(); ++r) c.send(a.data, bytes, r);
  } else {
    c.send(a.data, bytes, 0);
    c.recv(a.data, bytes, 0);
  }
}

// Root sends to every other rank.
void broadcast_ref(const BroadcastArgs& a) {
  Communicator& c = *a.comm;
  FP_CHECK(a.root >= 0 && a.root < c.size(), "broadcast from rank ", a.root, " of ", c.size());
  if (c.rank() == a.root) {
    for (int r = 0; r < c.size(); ++r)
      if (r != a.root) c.send(a.data, a.bytes, r);
  } else {
    c.recv(a.data, a.bytes, a.root);
  }
}

// Rank 0 collects every block in rank order, then broadcasts the whole.
void all_gather_ref(const AllGatherArgs& a) {
  Communicator& c = *a.comm;
  uint8_t* out = static_cast<uint8_t*>(a.recv);
  if (c.rank() == 0) {
    std::memmove(out, a.send, static_cast<size_t>(a.bytes));
    for (int r = 1; r < c.size(); ++r) c.recv(out + r * a.bytes, a.bytes, r);
  } else {
    c.send(a.send, a.bytes, 0);
  }
  broadcast_ref(BroadcastArgs{a.comm, a.recv, a.bytes * c.size(), 0});
}

// The reference all-reduce over the whole buffer, then this rank's block.
void reduce_scatter_ref(const ReduceScatterArgs& a) {
  Communicator& c = *a.comm;
  std::vector<float> all(a.send, a.send + a.n * c.size());
  all_reduce_ref(AllReduceArgs{a.comm, all.data(), static_cast<int64_t>(all.size())});
  std::memcpy(a.recv, all.data() + c.rank() * a.n, static_cast<size_t>(a.n) * sizeof(float));
}

// Pairs (i, j), i < j, exchanged in one global order (the lower rank sends first): every rank
// meets its partners in the same order, so no cycle of blocked sends can form.
void all_to_all_ref(const AllToAllArgs& a) {
  Communicator& c = *a.comm;
  const int n = c.size(), me = c.rank();
  std::vector<int64_t> sb(static_cast<size_t>(n), a.bytes), rb(static_cast<size_t>(n), a.bytes);
  if (a.send_bytes) {
    sb.assign(a.send_bytes, a.send_bytes + n);
    rb.assign(a.recv_bytes, a.recv_bytes + n);
  }
  std::vector<int64_t> so(static_cast<size_t>(n) + 1, 0), ro(static_cast<size_t>(n) + 1, 0);
  for (size_t j = 0; j < static_cast<size_t>(n); ++j) {
    so[j + 1] = so[j] + sb[j];
    ro[j + 1] = ro[j] + rb[j];
  }
  const uint8_t* in = static_cast<const uint8_t*>(a.send);
  uint8_t* out = static_cast<uint8_t*>(a.recv);
  const auto u = [](int r) { return static_cast<size_t>(r); };
  std::memmove(out + ro[u(me)], in + so[u(me)], static_cast<size_t>(sb[u(me)]));
  for (int i = 0; i < n; ++i)
    for (int j = i + 1; j < n; ++j) {
      if (me != i && me != j) continue;
      const int peer = me == i ? j : i;
      if (me == i) {
        c.send(in + so[u(peer)], sb[u(peer)], peer);
        c.recv(out + ro[u(peer)], rb[u(peer)], peer);
      } else {
        c.recv(out + ro[u(peer)], rb[u(peer)], peer);
        c.send(in + so[u(peer)], sb[u(peer)], peer);
      }
    }
}

// ---- "single": one rank; the communicator's own (trivial) collectives ---------------------

template <class Args>
Kernel<Args> backend_kernel(const char* backend, int priority, std::function<void(const Args&)> run,
                            Backend device = Backend::CPU) {
  return Kernel<Args>{backend, device, priority, false,
                      [backend](const Args& a) { return refuse_unless_backend(a.comm, backend); }, std::move(run)};
}

template <class Args>
Kernel<Args> ref_kernel(std::function<void(const Args&)> run) {
  return Kernel<Args>{"ref", Backend::CPU, 0, true, nullptr, std::move(run)};
}

const bool collectives_registered = [] {
  register_kernel(ref_kernel<AllReduceArgs>(all_reduce_ref));
  // The reference does not overlap: it completes the sum when started.
  register_kernel(ref_kernel<AllReduceStartArgs>([](const AllReduceStartArgs& a) {
    all_reduce_ref(AllReduceArgs{a.comm, a.data, a.n});
    *a.handle = Communicator::kDone;
  }));
  register_kernel(ref_kernel<CollectiveWaitArgs>([](const CollectiveWaitArgs& a) {
    if (a.handle != Communicator::kDone) a.comm->wait(a.handle);  // started by another kernel
  }));
  register_kernel(ref_kernel<AllGatherArgs>(all_gather_ref));
  register_kernel(ref_kernel<AllGatherStartArgs>([](const AllGatherStartArgs& a) {
    all_gather_ref(AllGatherArgs{a.comm, a.send, a.recv, a.bytes});
    *a.handle = Communicator::kDone;
  }));
  register_kernel(ref_kernel<ReduceScatterArgs>(reduce_scatter_ref));
  register_kernel(ref_kernel<ReduceScatterStartArgs>([](const ReduceScatterStartArgs& a) {
    reduce_scatter_ref(ReduceScatterArgs{a.comm, a.send, a.recv, a.n});
    *a.handle = Communicator::kDone;
  }));
  register_kernel(ref_kernel<AllToAllArgs>(all_to_all_ref));
  register_kernel(ref_kernel<BroadcastArgs>(broadcast_ref));
  // Asked first (priority 110, above "mpi" at 100), so an MPI run's ledger shows why it was refused.
  register_backend_collectives("single", 110);
  return true;
}();

}  // namespace

void register_backend_collectives(const char* backend, int priority, Backend device) {
  register_kernel(backend_kernel<AllReduceArgs>(
      backend, priority, [](const AllReduceArgs& a) { a.comm->all_reduce_sum(a.data, a.n); }, device));
  register_kernel(backend_kernel<AllReduceStartArgs>(
      backend, priority, [](const AllReduceStartArgs& a) { *a.handle = a.comm->start_all_reduce_sum(a.data, a.n); },
      device));
  register_kernel(backend_kernel<CollectiveWaitArgs>(
      backend, priority, [](const CollectiveWaitArgs& a) { a.comm->wait(a.handle); }, device));
  register_kernel(backend_kernel<AllGatherArgs>(
      backend, priority, [](const AllGatherArgs& a) { a.comm->all_gather(a.send, a.recv, a.bytes); }, device));
  register_kernel(backend_kernel<AllGatherStartArgs>(
      backend, priority,
      [](const AllGatherStartArgs& a) { *a.handle = a.comm->start_all_gather(a.send, a.recv, a.bytes); }, device));
  register_kernel(backend_kernel<ReduceScatterArgs>(
      backend, priority, [](const ReduceScatterArgs& a) { a.comm->reduce_scatter_sum(a.send, a.recv, a.n); }, device));
  register_kernel(backend_kernel<ReduceScatterStartArgs>(
      backend, priority,
      [](const ReduceScatterStartArgs& a) { *a.handle = a.comm->start_reduce_scatter_sum(a.send, a.recv, a.n); },
      device));
  register_kernel(backend_kernel<AllToAllArgs>(
      backend, priority,
      [](const AllToAllArgs& a) {
        if (a.send_bytes) a.comm->all_to_all_v(a.send, a.send_bytes, a.recv, a.recv_bytes);
        else a.comm->all_to_all(a.send, a.recv, a.bytes);
      },
      device));
  register_kernel(backend_kernel<BroadcastArgs>(
      backend, priority, [](const BroadcastArgs& a) { a.comm->broadcast(a.data, a.bytes, a.root); }, device));
}
}  // namespace fp
