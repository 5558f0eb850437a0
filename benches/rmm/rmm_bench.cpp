// RMM's side of the side-by-side benchmark with mrstack.
//
// Replays an op file written by the mrstack side (`rmm write-ops`, format in benches/rmm/ops.rs)
// through RMM's resources, with the layout and the timing of the mrstack side
// (mrstack::replay::Replayer for one thread, ThreadedReplayer for several):
//
// - stream index 0 is the default stream, every other index a stream of its own, created
//   non-blocking (as cudarc's `new_stream` creates mrstack's);
// - one thread: the ops run on the calling thread; several: each thread's ops on an OS thread of
//   its own (thread t on OS thread t % 256), started for each pass and timed from the moment every
//   thread is ready until the last one finishes; a free whose allocation another thread makes
//   waits for it (an atomic hand-over slot per allocation, as ThreadedReplayer's);
// - a pass ends by synchronizing every stream (timed); blocks left live are then freed, untimed;
// - one warm-up pass, then as many timed passes as fit in the budget (at least 1, at most
//   --passes; none after a warm-up over 2.5 budgets, whose figure then stands, marked
//   `warmup_only`); ns/op is the median pass over all ops of all threads.
//
// Resources, by the names the mrstack side uses for its stacks, so that the table pairs them:
//   cuda_async     cuda_async_memory_resource{}  (no initial pool, release threshold UINT64_MAX)
//   pool           pool_memory_resource(cuda_memory_resource, capacity, capacity)
//   binning        binning_memory_resource(pool, 8, 20): bins of 256 B .. 1 MiB (mrstack's default)
//   binning-rmm    binning_memory_resource(pool, 18, 22): bins of 256 KiB .. 4 MiB (RMM's examples)
//   arena          arena_memory_resource(cuda_memory_resource, capacity)
//   binning+arena  binning_memory_resource(arena, 8, 20)
//   cuda           cuda_memory_resource (cudaMalloc; only when asked for: slow)
//
// Usage: rmm_bench FILE [--stacks a,b] [--passes 5] [--budget-ms 2000] [--deadline UNIX_SECONDS]
// Prints one JSON line per resource on stdout, progress on stderr. `--host-check` replays over host
// memory instead, without a device (scripts/rmm-bench-check runs it where there is no GPU).
//
// Built by scripts/gpu-bench-rmm with nvcc against the librmm wheel (RMM 26.x: resources are
// cuda::mr::shared_resource types, upstreams cuda::mr::any_resource<device_accessible>).

#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/binning_memory_resource.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/version_config.hpp>

#include <cuda/stream_ref>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <limits>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

/// mrstack's MAX_REPLAY_THREADS: thread t of a file runs on OS thread t % 256.
constexpr std::size_t max_replay_threads = 256;

constexpr char const* magic = "mrstack-ops 1";

/// Set by --host-check: the JSON lines then say `"upstream":"host"`.
bool upstream_host = false;  // NOLINT(cppcoreguidelines-avoid-non-const-global-variables)

struct op {
  bool alloc;
  std::uint32_t thread;
  std::uint64_t id;
};

struct block {
  std::uint64_t size;
  std::uint64_t align;
  std::uint32_t stream;
};

struct op_file {
  std::string workload;
  std::size_t layout_threads{};
  std::string layout_streams;
  std::size_t threads{}, streams{}, capacity{}, peak_live{}, threaded_peak{}, allocations{};
  std::vector<op> ops;
  std::vector<block> blocks;  // by allocation id

  [[nodiscard]] std::string label() const
  {
    return std::to_string(layout_threads) + "-" + layout_streams;
  }
};

[[noreturn]] void file_error(std::string const& path, std::size_t line, std::string const& what)
{
  std::ostringstream s;
  s << path << ": ";
  if (line > 0) { s << "line " << line << ": "; }
  s << what;
  throw std::runtime_error(s.str());
}

std::uint64_t to_number(std::string const& text, std::string const& path, std::size_t line)
{
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    file_error(path, line, "not a number: `" + text + "`");
  }
  errno = 0;
  char* end{};
  auto v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') { file_error(path, line, "not a number: `" + text + "`"); }
  return v;
}

/// Reads and checks an op file: the header, every op (ids in order, frees of live allocations,
/// threads and streams within the header's counts), `end`, and the header's counts.
op_file read_ops(std::string const& path)
{
  std::ifstream in(path);
  if (!in) { file_error(path, 0, "cannot open"); }
  op_file f;
  std::string l;
  std::size_t n = 0;
  auto next = [&](char const* what) {
    if (!std::getline(in, l)) { file_error(path, n, std::string("ends before ") + what); }
    ++n;
    if (!l.empty() && l.back() == '\r') { l.pop_back(); }
  };
  auto field = [&](std::string const& key) {
    next(key.c_str());
    if (l.rfind(key + " ", 0) != 0) { file_error(path, n, "expected `" + key + " ...`"); }
    return l.substr(key.size() + 1);
  };
  next("the header");
  if (l != magic) { file_error(path, n, std::string("expected `") + magic + "`"); }
  f.workload = field("workload");
  {
    auto v  = field("layout");
    auto sp = v.find(' ');
    if (sp == std::string::npos) { file_error(path, n, "bad layout"); }
    f.layout_threads = to_number(v.substr(0, sp), path, n);
    f.layout_streams = v.substr(sp + 1);
  }
  f.threads       = to_number(field("threads"), path, n);
  f.streams       = to_number(field("streams"), path, n);
  f.capacity      = to_number(field("capacity"), path, n);
  f.peak_live     = to_number(field("peak_live"), path, n);
  f.threaded_peak = to_number(field("threaded_peak"), path, n);
  f.allocations   = to_number(field("allocations"), path, n);
  auto count      = to_number(field("ops"), path, n);
  if (f.threads == 0 || f.streams == 0) { file_error(path, n, "no threads or no streams"); }

  f.ops.reserve(count);
  f.blocks.reserve(f.allocations);
  std::vector<std::uint8_t> live;  // 1 while allocation id is live
  std::size_t now = 0, peak = 0;
  std::vector<std::string> fields;
  for (;;) {
    next("`end`");
    if (l == "end") { break; }
    fields.clear();
    std::istringstream s(l);
    for (std::string w; s >> w;) {
      fields.push_back(w);
    }
    if (fields.empty()) { file_error(path, n, "empty line"); }
    op o{};
    if (fields[0] == "a" && fields.size() == 6) {
      o.alloc      = true;
      o.thread     = static_cast<std::uint32_t>(to_number(fields[1], path, n));
      o.id         = to_number(fields[2], path, n);
      auto size    = to_number(fields[3], path, n);
      auto align   = to_number(fields[4], path, n);
      auto stream  = to_number(fields[5], path, n);
      if (o.id != f.blocks.size()) { file_error(path, n, "allocation ids must count from 0"); }
      if (align == 0 || (align & (align - 1)) != 0) { file_error(path, n, "bad alignment"); }
      if (stream >= f.streams) { file_error(path, n, "stream beyond the header's count"); }
      f.blocks.push_back(block{size, align, static_cast<std::uint32_t>(stream)});
      live.push_back(1);
      now += size;
      peak = std::max(peak, now);
    } else if (fields[0] == "f" && fields.size() == 3) {
      o.alloc  = false;
      o.thread = static_cast<std::uint32_t>(to_number(fields[1], path, n));
      o.id     = to_number(fields[2], path, n);
      if (o.id >= live.size() || live[o.id] == 0) {
        file_error(path, n, "free of an allocation that is not live");
      }
      live[o.id] = 0;
      now -= f.blocks[o.id].size;
    } else {
      file_error(path, n, "bad record `" + l + "`");
    }
    if (o.thread >= f.threads) { file_error(path, n, "thread beyond the header's count"); }
    f.ops.push_back(o);
  }
  if (f.ops.size() != count) { file_error(path, 0, "the header's op count differs"); }
  if (f.blocks.size() != f.allocations) { file_error(path, 0, "the header's allocations differ"); }
  if (peak != f.peak_live) { file_error(path, 0, "the header's peak_live differs"); }
  return f;
}

void check(cudaError_t e, char const* what)
{
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + " " +
                             cudaGetErrorString(e));
  }
}

/// As many timed passes as fit in `budget` after a warm-up pass of `warmup`: at least 1, at most
/// `max`, none after a warm-up over 2.5 budgets (ops::timed_passes on the mrstack side).
std::size_t timed_passes(double warmup_s, double budget_s, std::size_t max)
{
  // ops::SLOW: a warm-up over 2.5 budgets is the only pass; its figure stands, marked.
  constexpr double slow = 2.5;
  if (warmup_s > slow * budget_s) { return 0; }
  double fit = budget_s / std::max(warmup_s, 1e-9);
  double n   = std::floor(fit);
  n          = std::max(1.0, std::min(n, static_cast<double>(std::max<std::size_t>(max, 1))));
  return static_cast<std::size_t>(n);
}

double median(std::vector<double> v)
{
  if (v.empty()) { return std::numeric_limits<double>::quiet_NaN(); }
  std::sort(v.begin(), v.end());
  auto n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

/// The failure of a pass, at the op earliest in the file among the threads that failed.
struct pass_error : std::runtime_error {
  std::size_t op;
  pass_error(std::size_t at, std::string const& what) : std::runtime_error(what), op(at) {}
};

/// A replay of one op file through one resource, pass after pass.
template <class MR>
class replayer {
 public:
  replayer(MR& mr, op_file const& f, std::vector<cudaStream_t> const& streams, bool host)
    : mr_(mr),
      f_(f),
      streams_(streams),
      lanes_(std::min<std::size_t>(f.threads, max_replay_threads)),
      host_(host)
  {
    lane_ops_.resize(lanes_);
    for (std::size_t i = 0; i < f.ops.size(); ++i) {
      lane_ops_[f.ops[i].thread % max_replay_threads].push_back(i);
    }
    if (lanes_ == 1) {
      live_.assign(f.blocks.size(), nullptr);
      is_live_.assign(f.blocks.size(), 0);
    } else {
      slots_ = std::vector<slot>(f.blocks.size());
      // Each lane's slots side by side (ids dealt round-robin would put every lane on each cache
      // line), as ThreadedReplayer lays them out.
      pos_.assign(f.blocks.size(), 0);
      std::size_t next = 0;
      std::vector<std::size_t> lane_of(f.blocks.size(), 0);
      for (std::size_t l = 0; l < lanes_; ++l) {
        for (auto i : lane_ops_[l]) {
          if (f.ops[i].alloc) {
            pos_[f.ops[i].id]    = next++;
            lane_of[f.ops[i].id] = l;
          }
        }
      }
      // As ThreadedReplayer: a block freed by the lane that made it is not handed over.
      handed_.assign(f.blocks.size(), 0);
      for (std::size_t l = 0; l < lanes_; ++l) {
        for (auto i : lane_ops_[l]) {
          if (!f.ops[i].alloc) { handed_[f.ops[i].id] = lane_of[f.ops[i].id] != l ? 1 : 0; }
        }
      }
    }
  }

  /// One pass: seconds from the start to the end of the ops, plus synchronizing every stream.
  double pass() { return lanes_ == 1 ? pass_one() : pass_threads(); }

 private:
  /// Where a block passes from the thread that allocates it to the one that frees it.
  struct slot {
    std::atomic<void*> ptr{nullptr};
    std::atomic<int> waiter{0};
  };
  /// What a slot holds when the resource gave nullptr (a zero-size request), and after an abort.
  static inline void* const null_block = reinterpret_cast<void*>(std::uintptr_t{1});
  static inline void* const aborted    = reinterpret_cast<void*>(std::uintptr_t{2});

  cuda::stream_ref stream(std::uint32_t i) const { return cuda::stream_ref{streams_[i]}; }

  void synchronize() const
  {
    if (host_) { return; }
    for (std::size_t i = 0; i < f_.streams; ++i) {
      check(cudaStreamSynchronize(streams_[i]), "cudaStreamSynchronize");
    }
  }

  double pass_one()
  {
    auto start = clock_type::now();
    std::exception_ptr failure;
    std::size_t failed_at = 0;
    for (auto i : lane_ops_[0]) {
      auto const& o = f_.ops[i];
      auto const& b = f_.blocks[o.id];
      try {
        if (o.alloc) {
          live_[o.id]    = mr_.allocate(stream(b.stream), b.size, b.align);
          is_live_[o.id] = 1;
        } else if (is_live_[o.id] != 0) {
          mr_.deallocate(stream(b.stream), live_[o.id], b.size, b.align);
          is_live_[o.id] = 0;
        }
      } catch (...) {
        failure   = std::current_exception();
        failed_at = i;
        break;
      }
    }
    std::exception_ptr sync_failure;
    try {
      synchronize();
    } catch (...) {
      sync_failure = std::current_exception();
    }
    double elapsed = std::chrono::duration<double>(clock_type::now() - start).count();
    for (std::size_t id = 0; id < live_.size(); ++id) {
      if (is_live_[id] != 0) {
        auto const& b = f_.blocks[id];
        mr_.deallocate(stream(b.stream), live_[id], b.size, b.align);
        is_live_[id] = 0;
      }
    }
    if (failure) { rethrow_at(failure, failed_at); }
    if (sync_failure) { std::rethrow_exception(sync_failure); }
    return elapsed;
  }

  [[noreturn]] void rethrow_at(std::exception_ptr const& e, std::size_t at) const
  {
    try {
      std::rethrow_exception(e);
    } catch (std::exception const& x) {
      throw pass_error(at, "op " + std::to_string(at) + " (allocate " +
                             std::to_string(f_.blocks[f_.ops[at].id].size) + " bytes): " + x.what());
    }
  }

  /// Stops every thread of a pass: wakes each that waits for a block.
  void abort_all()
  {
    abort_.store(true, std::memory_order_seq_cst);
    for (auto& s : slots_) {
      if (s.waiter.load(std::memory_order_seq_cst) != 0) {
        void* expected = nullptr;
        s.ptr.compare_exchange_strong(expected, aborted, std::memory_order_seq_cst);
        s.ptr.notify_all();
      }
    }
  }

  /// Takes allocation `id`'s block once its thread has made it; nullptr if the pass aborts.
  void* wait_for(std::uint64_t id)
  {
    constexpr int spins  = 16;
    constexpr int yields = 4;
    auto& s              = slots_[pos_[id]];
    for (int i = 0; i < spins + yields; ++i) {
      void* p = s.ptr.load(std::memory_order_acquire);
      if (p != nullptr) {
        return p == aborted ? nullptr : (s.ptr.store(nullptr, std::memory_order_relaxed), p);
      }
      if (abort_.load(std::memory_order_relaxed)) { return nullptr; }
      if (i >= spins) { std::this_thread::yield(); }
    }
    s.waiter.store(1, std::memory_order_seq_cst);
    for (;;) {
      void* p = s.ptr.load(std::memory_order_seq_cst);
      if (p != nullptr) {
        s.waiter.store(0, std::memory_order_relaxed);
        if (p == aborted) { return nullptr; }
        s.ptr.store(nullptr, std::memory_order_relaxed);
        return p;
      }
      if (abort_.load(std::memory_order_seq_cst)) { return nullptr; }
      s.ptr.wait(nullptr, std::memory_order_seq_cst);
    }
  }

  /// Runs lane `lane`'s ops; returns when it finished, or records its failure.
  void run_lane(std::size_t lane, clock_type::time_point& done, std::exception_ptr& failure,
                std::size_t& failed_at)
  {
    // As ThreadedReplayer: a lane looks for an abort when it starts and while it waits, no more.
    if (abort_.load(std::memory_order_relaxed)) {
      done = clock_type::now();
      return;
    }
    for (auto i : lane_ops_[lane]) {
      auto const& o = f_.ops[i];
      auto const& b = f_.blocks[o.id];
      if (o.alloc) {
        void* p = nullptr;
        try {
          p = mr_.allocate(stream(b.stream), b.size, b.align);
        } catch (...) {
          failure   = std::current_exception();
          failed_at = i;
          abort_all();
          break;
        }
        auto& s = slots_[pos_[o.id]];
        if (handed_[o.id] == 0) {
          // Only this thread frees it: no one waits on the slot.
          s.ptr.store(p == nullptr ? null_block : p, std::memory_order_relaxed);
        } else {
          s.ptr.store(p == nullptr ? null_block : p, std::memory_order_seq_cst);
          if (s.waiter.load(std::memory_order_seq_cst) != 0) { s.ptr.notify_all(); }
        }
      } else {
        void* p = wait_for(o.id);
        if (p == nullptr) { break; }
        mr_.deallocate(stream(b.stream), p == null_block ? nullptr : p, b.size, b.align);
      }
    }
    done = clock_type::now();
  }

  double pass_threads()
  {
    abort_.store(false);
    std::atomic<std::size_t> ready{0};
    std::shared_mutex gate;
    std::unique_lock<std::shared_mutex> held(gate);
    std::vector<clock_type::time_point> done(lanes_);
    std::vector<std::exception_ptr> failures(lanes_);
    std::vector<std::size_t> failed_at(lanes_, 0);
    std::vector<std::thread> threads;
    threads.reserve(lanes_);
    for (std::size_t lane = 0; lane < lanes_; ++lane) {
      threads.emplace_back([&, lane] {
        ready.fetch_add(1, std::memory_order_release);
        { std::shared_lock<std::shared_mutex> go(gate); }
        run_lane(lane, done[lane], failures[lane], failed_at[lane]);
      });
    }
    while (ready.load(std::memory_order_acquire) < lanes_) {
      std::this_thread::yield();
    }
    auto start = clock_type::now();
    held.unlock();
    for (auto& t : threads) {
      t.join();
    }
    auto end = start;
    std::exception_ptr failure;
    std::size_t first = std::numeric_limits<std::size_t>::max();
    for (std::size_t lane = 0; lane < lanes_; ++lane) {
      end = std::max(end, done[lane]);
      if (failures[lane] && failed_at[lane] < first) {
        failure = failures[lane];
        first   = failed_at[lane];
      }
    }
    double elapsed = std::chrono::duration<double>(end - start).count();
    std::exception_ptr sync_failure;
    if (!failure) {
      auto sync_start = clock_type::now();
      try {
        synchronize();
      } catch (...) {
        sync_failure = std::current_exception();
      }
      elapsed += std::chrono::duration<double>(clock_type::now() - sync_start).count();
    }
    release();
    if (failure) { rethrow_at(failure, first); }
    if (sync_failure) { std::rethrow_exception(sync_failure); }
    return elapsed;
  }

  void release()
  {
    for (std::size_t id = 0; id < slots_.size(); ++id) {
      auto& s = slots_[pos_[id]];
      s.waiter.store(0, std::memory_order_relaxed);
      void* p = s.ptr.exchange(nullptr);
      if (p != nullptr && p != aborted) {
        auto const& b = f_.blocks[id];
        mr_.deallocate(stream(b.stream), p == null_block ? nullptr : p, b.size, b.align);
      }
    }
  }

  MR& mr_;
  op_file const& f_;
  std::vector<cudaStream_t> const& streams_;
  std::size_t lanes_;
  bool host_;  // --host-check: no device, no stream to synchronize
  std::vector<std::vector<std::size_t>> lane_ops_;  // each lane's op indices, in file order
  std::vector<void*> live_;                         // one lane: the live blocks by id
  std::vector<std::uint8_t> is_live_;
  std::vector<slot> slots_;         // several lanes: the hand-over slots, lane by lane
  std::vector<std::size_t> pos_;    // several lanes: each allocation id's slot
  std::vector<char> handed_;        // several lanes: 1 where another lane frees the allocation
  std::atomic<bool> abort_{false};
};

/// The resource of --host-check: host memory from aligned operator new, so that the replay
/// machinery (threads, hand-over, timing, output) can be checked where there is no GPU.
class host_resource {
 public:
  void* allocate(cuda::stream_ref, std::size_t bytes, std::size_t align)
  {
    // More than any host has: refused as a device resource would refuse it.
    if (bytes > (std::size_t{1} << 46)) { throw std::bad_alloc(); }
    return ::operator new(std::max<std::size_t>(bytes, 1), std::align_val_t{align});
  }
  void deallocate(cuda::stream_ref, void* p, std::size_t, std::size_t align) noexcept
  {
    ::operator delete(p, std::align_val_t{align});
  }
};

struct options {
  std::vector<std::string> stacks{
    "cuda_async", "pool", "binning", "binning-rmm", "arena", "binning+arena"};
  std::size_t passes{5};
  double budget_s{2.0};
  double deadline{0};  // unix seconds; 0: none
  bool host{false};    // --host-check
};

struct measured {
  double warmup;  // ns/op
  std::vector<double> passes;
  double seconds;
};

template <class MR>
measured measure(MR& mr, op_file const& f, std::vector<cudaStream_t> const& streams,
                 options const& o)
{
  auto started = clock_type::now();
  replayer<MR> r(mr, f, streams, o.host);
  double ops    = static_cast<double>(std::max<std::size_t>(f.ops.size(), 1));
  double warm_s = 0;
  try {
    warm_s = r.pass();
  } catch (std::exception const& e) {
    throw std::runtime_error(std::string("warm-up pass: ") + e.what());
  }
  auto n = timed_passes(warm_s, o.budget_s, o.passes);
  measured m{warm_s * 1e9 / ops, {}, 0};
  for (std::size_t i = 0; i < n; ++i) {
    m.passes.push_back(r.pass() * 1e9 / ops);
  }
  m.seconds = std::chrono::duration<double>(clock_type::now() - started).count();
  return m;
}

std::string json(std::string const& s)
{
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string fixed(double v)
{
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

void emit(op_file const& f, std::string const& stack, std::string const& what, measured const* m,
          std::string const& error)
{
  std::ostringstream s;
  s << "{\"lib\":\"rmm\",\"workload\":" << json(f.workload) << ",\"layout\":\"" << f.label()
    << "\",\"threads\":" << f.layout_threads << ",\"streams\":" << json(f.layout_streams)
    << ",\"stack\":" << json(stack) << ",\"what\":" << json(what)
    << ",\"upstream\":\"" << (upstream_host ? "host" : "cuda") << "\",\"ops\":" << f.ops.size()
    << ",\"capacity\":" << f.capacity;
  if (m != nullptr) {
    // No timed pass (a warm-up over 2.5 budgets): the warm-up's figure, marked.
    bool const warmup_only = m->passes.empty();
    double const ns        = warmup_only ? m->warmup : median(m->passes);
    s << ",\"ok\":true,\"ns_per_op\":" << fixed(ns)
      << ",\"warmup_only\":" << (warmup_only ? "true" : "false")
      << ",\"warmup_ns_per_op\":" << fixed(m->warmup) << ",\"passes\":[";
    for (std::size_t i = 0; i < m->passes.size(); ++i) {
      s << (i ? "," : "") << fixed(m->passes[i]);
    }
    s << "],\"seconds\":" << fixed(m->seconds) << "}";
    std::fprintf(stderr,
                 "  %-14s %12.1f ns/op (%zu passes%s)\n",
                 stack.c_str(),
                 ns,
                 m->passes.size(),
                 warmup_only ? ", the warm-up's figure" : "");
  } else {
    s << ",\"ok\":false,\"error\":" << json(error) << "}";
    std::fprintf(stderr, "  %-14s %s\n", stack.c_str(), error.c_str());
  }
  std::cout << s.str() << std::endl;
}

/// Builds resource `name` with the file's capacity, measures it, and prints its line.
void run_stack(std::string const& name, op_file const& f, std::vector<cudaStream_t> const& streams,
               options const& o)
{
  using rmm::mr::arena_memory_resource;
  using rmm::mr::binning_memory_resource;
  using rmm::mr::cuda_async_memory_resource;
  using rmm::mr::cuda_memory_resource;
  using rmm::mr::pool_memory_resource;
  auto const cap = f.capacity;
  std::string what;
  try {
    measured m{};
    if (o.host) {
      what = "host_resource (aligned operator new): --host-check";
      host_resource mr;
      m = measure(mr, f, streams, o);
    } else if (name == "cuda") {
      what = "cuda_memory_resource (cudaMalloc)";
      cuda_memory_resource mr;
      m = measure(mr, f, streams, o);
    } else if (name == "cuda_async") {
      what = "cuda_async_memory_resource{} (release threshold UINT64_MAX)";
      cuda_async_memory_resource mr{};
      m = measure(mr, f, streams, o);
    } else if (name == "pool") {
      what = "pool_memory_resource(cuda, cap, cap)";
      pool_memory_resource mr{cuda_memory_resource{}, cap, cap};
      m = measure(mr, f, streams, o);
    } else if (name == "binning") {
      what = "binning_memory_resource(pool(cuda, cap, cap), 8, 20): bins 256 B .. 1 MiB";
      pool_memory_resource pool{cuda_memory_resource{}, cap, cap};
      binning_memory_resource mr{pool, 8, 20};
      m = measure(mr, f, streams, o);
    } else if (name == "binning-rmm") {
      what = "binning_memory_resource(pool(cuda, cap, cap), 18, 22): bins 256 KiB .. 4 MiB";
      pool_memory_resource pool{cuda_memory_resource{}, cap, cap};
      binning_memory_resource mr{pool, 18, 22};
      m = measure(mr, f, streams, o);
    } else if (name == "arena") {
      what = "arena_memory_resource(cuda, cap)";
      arena_memory_resource mr{cuda_memory_resource{}, cap};
      m = measure(mr, f, streams, o);
    } else if (name == "binning+arena") {
      what = "binning_memory_resource(arena(cuda, cap), 8, 20): bins 256 B .. 1 MiB";
      arena_memory_resource arena{cuda_memory_resource{}, cap};
      binning_memory_resource mr{arena, 8, 20};
      m = measure(mr, f, streams, o);
    } else {
      // A stack only mrstack has (its thread caches, its TLSF): nothing to pair, no line.
      std::fprintf(stderr, "rmm: no resource named %s here: skipped\n", name.c_str());
      return;
    }
    emit(f, name, what, &m, "");
  } catch (std::exception const& e) {
    emit(f, name, what, nullptr, e.what());
  }
}

double unix_now()
{
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

[[noreturn]] void usage()
{
  std::fprintf(stderr,
               "usage: rmm_bench FILE [--stacks cuda_async,pool,binning,binning-rmm,arena,"
               "binning+arena,cuda] [--passes 5] [--budget-ms 2000] [--deadline UNIX_SECONDS] "
               "[--host-check]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv)
{
  options o;
  std::string path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value    = [&]() -> std::string {
      if (i + 1 >= argc) { usage(); }
      return argv[++i];
    };
    try {
      if (a == "--stacks") {
        o.stacks.clear();
        std::istringstream s(value());
        for (std::string w; std::getline(s, w, ',');) {
          if (!w.empty()) { o.stacks.push_back(w); }
        }
      } else if (a == "--passes") {
        o.passes = std::stoul(value());
      } else if (a == "--budget-ms") {
        o.budget_s = std::stod(value()) / 1000.0;
      } else if (a == "--host-check") {
        o.host        = true;
        o.stacks      = {"host"};
        upstream_host = true;
      } else if (a == "--deadline") {
        o.deadline = std::stod(value());
      } else if (a == "-h" || a == "--help" || a.rfind("--", 0) == 0 || !path.empty()) {
        usage();
      } else {
        path = a;
      }
    } catch (std::logic_error const&) {
      usage();
    }
  }
  if (path.empty()) { usage(); }
  try {
    auto f = read_ops(path);
    if (o.host) {
      // No device: the replay machinery over host memory, streams left null and unsynchronized.
      std::vector<cudaStream_t> streams(f.streams, cudaStream_t{});
      std::fprintf(stderr, "host check: %s %s\n", f.workload.c_str(), f.label().c_str());
      if (o.deadline > 0 && unix_now() >= o.deadline) {
        emit(f, "host", "", nullptr, "skipped: deadline");
      } else {
        run_stack("host", f, streams, o);
      }
      return 0;
    }
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaFree(nullptr), "initializing the device");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::fprintf(stderr,
                 "rmm %s on %s: %s %s: %zu ops on %zu threads, %zu streams, capacity %.2f GiB\n",
                 RMM_VERSION,
                 prop.name,
                 f.workload.c_str(),
                 f.label().c_str(),
                 f.ops.size(),
                 f.threads,
                 f.streams,
                 static_cast<double>(f.capacity) / (1ULL << 30));
    // Index 0 is the default stream; every other index a non-blocking stream of its own.
    std::vector<cudaStream_t> streams(f.streams, cudaStream_t{});
    for (std::size_t i = 1; i < f.streams; ++i) {
      check(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking), "cudaStreamCreate");
    }
    for (auto const& name : o.stacks) {
      if (o.deadline > 0 && unix_now() >= o.deadline) {
        emit(f, name, "", nullptr, "skipped: deadline");
        continue;
      }
      run_stack(name, f, streams, o);
    }
    for (std::size_t i = 1; i < f.streams; ++i) {
      cudaStreamDestroy(streams[i]);
    }
  } catch (std::exception const& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
