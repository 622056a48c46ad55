// Probe: what asking the driver whether a stream is being captured costs (the query every
// allocation and free makes since the fifth audit: docs/RELIABILITY.md), beside other per-stream
// driver queries, on one thread and on 8 and 16 threads with a stream each (issue 30; run 152).
// Not part of any build: compiled and run by hand, as docs/gpu-runs.md records.
//   P=~/.cache/raft-rs/26.08.00/prefix/nvidia/cu13
//   g++ -O2 -std=c++17 tests/bench/capture_probe.cpp -I$P/include -L$P/lib -l:libcudart.so.13 -lpthread -o capture-probe
//   (GPU machine) LD_LIBRARY_PATH=<the image's nvidia/cu13/lib> ./capture-probe
#include <cuda.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>
#include <atomic>

template <class F> double per_call_ns(F f, int n = 100000)
{
  std::vector<double> s;
  for (int r = 0; r < 21; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    auto t1 = std::chrono::steady_clock::now();
    s.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / n);
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

using is_capt_fn = CUresult (*)(CUstream, CUstreamCaptureStatus*);
using get_ctx_fn = CUresult (*)(CUcontext*);
using flags_fn = CUresult (*)(CUstream, unsigned*);
using id_fn = CUresult (*)(CUstream, unsigned long long*);
using info_fn = CUresult (*)(CUstream, CUstreamCaptureStatus*, cuuint64_t*, CUgraph*, const CUgraphNode**, const CUgraphEdgeData**, size_t*);

template <class T> T entry(const char* name, int version = 12000)
{
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &found) != cudaSuccess || fn == nullptr) {
    std::printf("no %s\n", name);
    return nullptr;
  }
  return reinterpret_cast<T>(fn);
}

int main()
{
  cudaSetDevice(0);
  cudaFree(nullptr);
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  auto is_capt = entry<is_capt_fn>("cuStreamIsCapturing");
  auto get_ctx = entry<get_ctx_fn>("cuCtxGetCurrent");
  auto flags = entry<flags_fn>("cuStreamGetFlags");
  auto sid = entry<id_fn>("cuStreamGetId");
  auto info = entry<info_fn>("cuStreamGetCaptureInfo", 12030);
  int sink = 0;                 // one thread's calls: a plain sum
  std::atomic<int> total{0};    // the threads' sums, added once each
  CUstreamCaptureStatus st;
  std::printf("cuCtxGetCurrent: %.1f ns\n", per_call_ns([&] { CUcontext c; get_ctx(&c); sink += c != nullptr; }));
  std::printf("cuStreamIsCapturing (own stream): %.1f ns\n", per_call_ns([&] { is_capt((CUstream)s, &st); sink += st; }));
  std::printf("cuStreamIsCapturing (legacy default stream): %.1f ns\n", per_call_ns([&] { is_capt(nullptr, &st); sink += st; }));
  std::printf("cudaStreamIsCapturing (runtime, own stream): %.1f ns\n", per_call_ns([&] { cudaStreamCaptureStatus r; cudaStreamIsCapturing(s, &r); sink += r; }));
  if (info) std::printf("cuStreamGetCaptureInfo v3 (status only): %.1f ns\n", per_call_ns([&] { info((CUstream)s, &st, nullptr, nullptr, nullptr, nullptr, nullptr); sink += st; }));
  std::printf("cuStreamGetFlags: %.1f ns\n", per_call_ns([&] { unsigned f; flags((CUstream)s, &f); sink += f; }));
  if (sid) std::printf("cuStreamGetId: %.1f ns\n", per_call_ns([&] { unsigned long long i; sid((CUstream)s, &i); sink += (int)i; }));
  for (int threads : {1, 8, 16}) {
    for (int which = 0; which < 2; ++which) {
      std::vector<std::thread> ts;
      std::vector<double> res(threads);
      std::atomic<int> ready{0};
      for (int t = 0; t < threads; ++t) {
        ts.emplace_back([&, t] {
          cudaSetDevice(0);
          cudaStream_t mine;
          cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking);
          ready++;
          while (ready.load() < threads) {}
          CUstreamCaptureStatus st2;
          int local = 0;  // per thread: a shared counter would measure its own contention
          res[t] = which == 0 ? per_call_ns([&] { is_capt((CUstream)mine, &st2); local += st2; }, 50000)
                              : per_call_ns([&] { CUcontext c; get_ctx(&c); local += c != nullptr; }, 50000);
          total += local;
          cudaStreamDestroy(mine);
        });
      }
      for (auto& t : ts) t.join();
      std::sort(res.begin(), res.end());
      std::printf("%d threads, a stream each, %s: median thread %.1f ns a call (slowest %.1f)\n", threads,
                  which == 0 ? "cuStreamIsCapturing" : "cuCtxGetCurrent", res[threads / 2], res.back());
    }
  }
  std::printf("sink %d\n", (sink + total.load()) & 1);
  return 0;
}
