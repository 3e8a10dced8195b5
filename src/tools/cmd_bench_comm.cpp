// tools/cmd_bench_comm.cpp — `fastpath bench-comm`: the collectives between the ranks of this
// launch, measured as nccl-tests measures them. For each op and message size: the slowest rank's
// time per call (median over the iterations), the algorithm bandwidth (bytes / time) and the bus
// bandwidth (what each link carried: all-reduce 2(n-1)/n x bytes, all-gather (n-1)/n x the
// gathered bytes, per second), then the interconnect figures `plan` reads from a hardware file
// (parallel/planner.h: per ring step latency from the smallest all-reduce, link bandwidth from the
// largest bus bandwidth), so a machine's file can carry its measured link instead of a guess.
// Under mpirun on CPU ranks (MPI) or with --device cuda on GPU ranks (NCCL); one rank measures
// nothing but the call overhead.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/registry.h"
#include "parallel/collectives.h"
#include "parallel/communicator.h"
#include "tools/common.h"

namespace fp::tools {

namespace {

struct Opts {
  std::vector<std::string> sizes{"4", "1K", "64K", "1M", "16M"};
  int iters = 20, warmup = 3;
  std::string device = "cpu";
  bool json = false, quiet = false;
};

// "64K" -> 65536; plain numbers are bytes.
int64_t parse_bytes(const std::string& s) {
  FP_CHECK(!s.empty(), "--sizes: an empty size");
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    fail("--sizes: '", s, "' is not a size (bytes, or with K, M, G)");
  }
  const std::string unit = s.substr(used);
  const double scale = unit.empty() || unit == "B" ? 1 : unit == "K" || unit == "KiB" ? 1024.0
                     : unit == "M" || unit == "MiB" ? 1048576.0 : unit == "G" || unit == "GiB" ? 1073741824.0 : -1;
  FP_CHECK(scale > 0 && v > 0 && v * scale <= 1073741824.0, "--sizes: '", s, "' is not a size from 1 byte to 1G");
  return std::max<int64_t>(4, static_cast<int64_t>(v * scale) / 4 * 4);  // whole f32 values
}

struct Row {
  std::string op;
  int64_t bytes = 0;  // per rank: the all-reduce's buffer, the all-gather's send
  double seconds = 0, algbw = 0, busbw = 0;
};

void add_bench_comm_impl(CLI::App& app) {
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("bench-comm",
                                 "time the collectives between the ranks (mpirun -np N; nccl-tests' figures) and print the "
                                 "interconnect figures for a hardware file");
  cmd->add_option("--sizes", o->sizes,
                  "message sizes per rank (bytes, or with K, M, G; rounded down to whole f32 values), e.g. 4,64K,16M")
      ->delimiter(',');
  cmd->add_option("--iters", o->iters, "timed calls per size (median of the slowest rank's times)")->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", o->warmup, "untimed calls per size")->check(CLI::Range(0, 1000));
  cmd->add_option("--device", o->device, "where the buffers live: cpu (MPI between the ranks) or cuda (NCCL)")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "one JSON object on stdout");
  cmd->add_flag("-q,--quiet", o->quiet, "only errors on stderr");
  cmd->callback([o] {
    if (o->quiet) set_log_level(LogLevel::Error);
    Device dev = Device::CPU;
    FP_CHECK(device_from_name(o->device, &dev), "--device '", o->device, "': expected cpu or cuda");
    const int n = launched_world_size();
    std::shared_ptr<Communicator> world = open_world(n, "the launch (mpirun -np)");
    std::shared_ptr<Communicator> comm = world;
    if (dev != Device::CPU) {
      const std::string why = device_unavailable(dev);
      FP_CHECK(why.empty(), "--device ", o->device, ": ", why);
      comm = open_device_communicator(device_name(dev), world);  // NCCL, one rank too (device buffers)
    }
    if (world->rank() != 0) set_log_level(LogLevel::Error);
    std::vector<int64_t> sizes;
    for (const std::string& s : o->sizes) sizes.push_back(parse_bytes(s));
    std::sort(sizes.begin(), sizes.end());
    const int64_t largest = sizes.back();
    DeviceBuffer send(dev, static_cast<size_t>(largest)), recv(dev, static_cast<size_t>(largest) * static_cast<size_t>(n));
    std::vector<float> ones(static_cast<size_t>(largest / 4), 1.0f);
    copy_bytes(dev, send.data(), Device::CPU, ones.data(), static_cast<size_t>(largest));
    auto sync = [&] {
      if (dev != Device::CPU) device_memory(dev).synchronize();
    };
    // The slowest rank's time for one call of `op` (every rank gets the same figure).
    auto timed = [&](auto op) {
      dispatch(BroadcastArgs{world.get(), ones.data(), 4, 0});  // start together (a host collective)
      const auto t0 = std::chrono::steady_clock::now();
      op();
      sync();
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::vector<double> all(static_cast<size_t>(n));
      dispatch(AllGatherArgs{world.get(), &s, all.data(), static_cast<int64_t>(sizeof s)});
      return *std::max_element(all.begin(), all.end());
    };
    std::vector<Row> rows;
    for (const char* name : {"all_reduce", "all_gather"})
      for (int64_t bytes : sizes) {
        const bool reduce = std::string(name) == "all_reduce";
        auto op = [&] {
          if (reduce) dispatch(AllReduceArgs{comm.get(), send.as<float>(), bytes / 4});
          else dispatch(AllGatherArgs{comm.get(), send.data(), recv.data(), bytes});
        };
        for (int i = 0; i < o->warmup; ++i) timed(op);
        std::vector<double> t;
        for (int i = 0; i < o->iters; ++i) t.push_back(timed(op));
        std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
        Row r{name, bytes, t[t.size() / 2]};
        // nccl-tests: algbw = the op's bytes / time; busbw = algbw x the factor that makes it
        // comparable with a link's speed (2(n-1)/n for all-reduce, (n-1)/n for all-gather, whose
        // bytes are the gathered total).
        const double total = reduce ? static_cast<double>(bytes) : static_cast<double>(bytes) * n;
        r.algbw = total / r.seconds / 1e9;
        r.busbw = r.algbw * (reduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n);
        rows.push_back(r);
      }
    if (world->rank() != 0) return;
    // The hardware file's interconnect: a ring all-reduce of B bytes on n ranks takes
    // call + 2(n-1)/n B / link + 2(n-1) step (parallel/planner.h); the smallest message gives the
    // latency terms (all counted per step here), the best bus bandwidth the link.
    double small = 0, link = 0;
    for (const Row& r : rows)
      if (r.op == "all_reduce") {
        if (small == 0) small = r.seconds;
        link = std::max(link, r.busbw);
      }
    const double step_us = n > 1 ? small * 1e6 / (2.0 * (n - 1)) : 0;
    nlohmann::json j;
    j["ranks"] = n;
    j["device"] = device_name(dev);
    j["backend"] = comm->backend();
    j["iters"] = o->iters;
    for (const Row& r : rows)
      j["results"].push_back({{"op", r.op}, {"bytes", r.bytes}, {"seconds", r.seconds}, {"algbw_gbps", r.algbw},
                              {"busbw_gbps", r.busbw}});
    j["interconnect"] = {{"bandwidth_gbps", link}, {"latency_us", step_us}, {"collective_us", 0}};
    if (o->json) {
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    std::printf("%d rank(s), %s buffers, %s collectives; median of %d calls, the slowest rank's time\n", n,
                device_name(dev), comm->backend(), o->iters);
    std::printf("%-11s %12s %12s %12s %12s\n", "op", "bytes/rank", "time (us)", "algbw GB/s", "busbw GB/s");
    for (const Row& r : rows)
      std::printf("%-11s %12lld %12.2f %12.3f %12.3f\n", r.op.c_str(), static_cast<long long>(r.bytes), r.seconds * 1e6,
                  r.algbw, r.busbw);
    if (n > 1)
      std::printf("interconnect for a hardware file: {\"bandwidth_gbps\": %.2f, \"latency_us\": %.2f, \"collective_us\": 0}\n"
                  "  (latency: the smallest all-reduce over its 2(n-1) ring steps; bandwidth: the best all-reduce bus bandwidth)\n",
                  link, step_us);
    else
      std::printf("one rank: nothing crosses a link (the times are the calls' overhead)\n");
  });
}

}  // namespace

void add_bench_comm(CLI::App& app) { add_bench_comm_impl(app); }

}  // namespace fp::tools
