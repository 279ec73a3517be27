// Host populate probe: the cost of populating fresh anonymous memory, as
// the host device does before a load writes it (docs/RESIDENCY.md), by
// thread count and page policy, one variant per process:
//   l  mlock2(MLOCK_ONFAULT) first (what the host device does)
//   n  nothing (plain anonymous memory)
//   h  MADV_HUGEPAGE first (transparent huge pages)
// each then MADV_POPULATE_WRITE over THREADS threads in 64 MiB pieces.
//
//   g++ -O2 -std=c++17 -pthread benchmarks/host_populate_probe.cpp -o /tmp/populate
//   for v in l n h lh; do for t in 1 4 16; do /tmp/populate 3400 $t $v; done; done   # MiB, threads, variant
#include <errno.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <atomic>
#include <string>
#include <vector>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
int main(int argc, char** argv) {
  if (argc != 4) { fprintf(stderr, "usage: %s MIB THREADS l|n|h|lh\n", argv[0]); return 2; }
  size_t len = strtoull(argv[1], 0, 10) << 20; int T = atoi(argv[2]); std::string v = argv[3];
  if (len == 0 || T <= 0 || v.find_first_not_of("lnh") != std::string::npos) { fprintf(stderr, "bad arguments\n"); return 2; }
  char* p = (char*)mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) { perror("mmap"); return 1; }
  auto t0 = std::chrono::steady_clock::now();
  if (v.find('h') != std::string::npos) madvise(p, len, MADV_HUGEPAGE);
  if (v.find('l') != std::string::npos && mlock2(p, len, MLOCK_ONFAULT)) { perror("mlock2"); return 1; }
  size_t chunk = 64 << 20; std::vector<std::thread> th; std::atomic<size_t> next{0}; std::atomic<int> failed{0};
  for (int t = 0; t < T; ++t) th.emplace_back([&] { for (;;) { size_t o = next.fetch_add(chunk); if (o >= len) break; if (madvise(p + o, std::min(chunk, len - o), MADV_POPULATE_WRITE)) failed = errno; } });
  for (auto& x : th) x.join();
  if (failed) { fprintf(stderr, "MADV_POPULATE_WRITE: %s\n", strerror(failed)); return 1; }
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  rusage u; getrusage(RUSAGE_SELF, &u);
  printf("populate %zu MiB T=%d %s: %.3f s wall, sys %.2f s, %.1f GB/s\n", len >> 20, T, v.c_str(), t, u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6, len / t / 1e9);
}
