// CUDA staging probe: what the machine allows an upload that copies
// through the CPU (hf2q's scheme: threads `pread` checkpoint files into a
// ring of pinned slots and queue async host-to-device copies), against a
// pinned copy (the bus) and against the copy engine reading the page cache
// directly (the files mapped read-only and registered with
// cuMemHostRegister). Nothing of hf2q is used: it measures the machine, so
// that a loader's number can be explained (docs/CUDA.md, "What limits a
// full-size load"). Per thread it reports the time in `pread` (and its
// rate) and the time spent waiting for a free slot.
//
//   g++ -O2 -std=c++17 -pthread benchmarks/cuda_staging_probe.cpp -o /tmp/probe -ldl
//   /tmp/probe s|d|g|h... FILE...  (s: slot/ring/thread sweep, d: registered mappings,
//                                   g: K gathered reads per slot, h: only hf2q's
//                                   shape, 4 reads per slot into its ring kind, 4 runs,
//                                   a: reads on a cache line against 8 bytes past one)
//
// Files in /dev/shm (tmpfs: the page cache is not the question). The
// device needs room for all of the files' bytes.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <condition_variable>
#include <string>
#include <thread>
#include <vector>
typedef int CUresult; typedef int CUdevice; typedef void* CUcontext; typedef void* CUstream; typedef void* CUevent;
typedef unsigned long long CUdeviceptr;
#define F(n, ...) static CUresult (*n)(__VA_ARGS__);
F(cuInit, unsigned) F(cuDeviceGet, CUdevice*, int) F(cuDevicePrimaryCtxRetain, CUcontext*, CUdevice)
F(cuCtxSetCurrent, CUcontext) F(cuMemAlloc_v2, CUdeviceptr*, size_t) F(cuMemHostAlloc, void**, size_t, unsigned)
F(cuMemHostRegister_v2, void*, size_t, unsigned) F(cuMemHostUnregister, void*)
F(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void*, size_t, CUstream) F(cuStreamCreate, CUstream*, unsigned)
F(cuStreamSynchronize, CUstream) F(cuEventCreate, CUevent*, unsigned) F(cuEventRecord, CUevent, CUstream)
F(cuEventSynchronize, CUevent) F(cuCtxSynchronize) F(cuMemFreeHost, void*) F(cuStreamDestroy_v2, CUstream)
F(cuEventDestroy_v2, CUevent)
#define CK(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "%s = %d line %d\n", #x, r_, __LINE__); exit(1);} } while (0)
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static CUcontext ctx; static CUdeviceptr dbuf; static size_t total;
struct File { std::string path; int fd; size_t size; };
static std::vector<File> files;
static double cpu() { rusage u; getrusage(RUSAGE_SELF, &u); return u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6; }
static double sys() { rusage u; getrusage(RUSAGE_SELF, &u); return u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6; }

// hf2q's scheme: T threads, ring of S slots x B bytes, a stream per slot;
// each slot filled by K reads of B/K bytes (K > 1: gathered tensors, as an
// expert stack of per-expert tensors is), scattered over the file when
// `scatter` (the reads of one slot K strides apart) or back to back, each
// read `shift` bytes past a multiple of B/K (an FP8 checkpoint's weights
// lie between 256-byte scale tensors).
// `registered`: the ring is hf2q's kind of memory (an anonymous mapping
// advised to use huge pages, pinned with cuMemHostRegister) instead of
// cuMemHostAlloc's.
static void ring(int T, int S, size_t B, int K = 1, bool scatter = false, size_t shift = 0, bool registered = false) {
  struct Slot { void* h; CUstream s; CUevent e; bool pend; };
  std::vector<Slot> slots(S); void* host;
  const size_t ring_len = (size_t)S * B;
  if (registered) {
    host = mmap(nullptr, ring_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (host == MAP_FAILED) { perror("mmap"); exit(1); }
    madvise(host, ring_len, MADV_HUGEPAGE);
    CK(cuMemHostRegister_v2(host, ring_len, 1));
  } else {
    CK(cuMemHostAlloc(&host, ring_len, 1));
  }
  for (int i = 0; i < S; ++i) { slots[i].h = (char*)host + (size_t)i * B; CK(cuStreamCreate(&slots[i].s, 1)); CK(cuEventCreate(&slots[i].e, 2)); slots[i].pend = false; }
  // One slot's reads: a group of up to K (file, offset, length), landing back to back at `dst`.
  struct Read { int f; size_t off, len; };
  struct Group { std::vector<Read> reads; size_t dst; };
  std::vector<Group> groups; size_t d = 0;
  const size_t P = B / K;  // one read
  for (int f = 0; f < (int)files.size(); ++f) {
    const size_t size = files[f].size;
    if (size <= shift) continue;
    if (K == 1) {  // the whole file (from `shift`), its tail included
      for (size_t o = shift; o < size; o += B) { size_t l = std::min(B, size - o); groups.push_back({{{f, o, l}}, d}); d += l; }
      continue;
    }
    const size_t n = (size - shift) / P, rows = (n + K - 1) / K;  // whole reads of this file; slots' worth
    for (size_t r = 0; r < rows; ++r) {
      Group g{{}, d};
      for (size_t j = 0; j < (size_t)K; ++j) {
        const size_t src = scatter ? j * rows + r : r * K + j;  // slot r's read j
        if (src < n) { g.reads.push_back({f, src * P + shift, P}); d += P; }
      }
      if (!g.reads.empty()) groups.push_back(std::move(g));
    }
  }
  std::mutex mu; std::condition_variable cv; std::deque<int> free_; for (int i = 0; i < S; ++i) free_.push_back(i);
  std::atomic<size_t> next{0}; std::vector<double> tread(T), twait(T);
  double t0 = now(), c0 = cpu(), s0 = sys();
  std::vector<std::thread> th;
  for (int t = 0; t < T; ++t) th.emplace_back([&, t] {
    CK(cuCtxSetCurrent(ctx));
    for (;;) {
      size_t gi = next++; if (gi >= groups.size()) break;
      const Group& g = groups[gi];
      double a = now(); int k;
      { std::unique_lock<std::mutex> lk(mu); cv.wait(lk, [&] { return !free_.empty(); }); k = free_.front(); free_.pop_front(); }
      Slot& s = slots[k]; if (s.pend) CK(cuEventSynchronize(s.e));
      double b = now(); twait[t] += b - a;
      size_t at = 0;
      for (const Read& rd : g.reads) {
        size_t got = 0; while (got < rd.len) { ssize_t r = pread(files[rd.f].fd, (char*)s.h + at + got, rd.len - got, rd.off + got); if (r <= 0) { fprintf(stderr, "pread: %s\n", r == 0 ? "unexpected end of file" : strerror(errno)); exit(1); } got += r; }
        at += got;
      }
      tread[t] += now() - b;
      CK(cuMemcpyHtoDAsync_v2(dbuf + g.dst, s.h, at, s.s)); CK(cuEventRecord(s.e, s.s)); s.pend = true;
      { std::lock_guard<std::mutex> lk(mu); free_.push_back(k); } cv.notify_one();
    }
  });
  for (auto& x : th) x.join();
  CK(cuCtxSynchronize());
  double t = now() - t0; double sr = 0, sw = 0; for (int i = 0; i < T; ++i) { sr += tread[i]; sw += twait[i]; }
  for (Slot& x : slots) { CK(cuStreamDestroy_v2(x.s)); CK(cuEventDestroy_v2(x.e)); }
  if (registered) { CK(cuMemHostUnregister(host)); munmap(host, ring_len); } else { CK(cuMemFreeHost(host)); }
  printf("ring T=%d S=%d B=%zuM K=%d%s shift=%zu%s: %.3f s %.1f GB/s cpu %.2f sys %.2f; per thread pread %.3f s (%.1f GB/s/thread) wait %.3f s\n", T, S, B >> 20, K, scatter ? " scattered" : "", shift, registered ? " registered" : "", t, d / t / 1e9, cpu() - c0, sys() - s0, sr / T, d / sr / 1e9, sw / T);
}

// Direct DMA from registered mappings: a window of W bytes at a time per
// thread: mmap, register (read-only), copies in C-byte pieces on the thread's stream, sync, unregister, unmap.
static void direct(int T, size_t W, size_t C, unsigned flags, bool populate) {
  struct Win { int f; size_t off, len, dst; }; std::vector<Win> ws; size_t d = 0;
  for (int f = 0; f < (int)files.size(); ++f) for (size_t o = 0; o < files[f].size; o += W) { size_t l = std::min(W, files[f].size - o); ws.push_back({f, o, l, d}); d += l; }
  std::atomic<size_t> next{0}; std::vector<double> tmap(T), treg(T), tcopy(T), tunreg(T);
  double t0 = now(), c0 = cpu(), s0 = sys();
  std::vector<std::thread> th;
  for (int t = 0; t < T; ++t) th.emplace_back([&, t] {
    CK(cuCtxSetCurrent(ctx)); CUstream st; CK(cuStreamCreate(&st, 1));
    // double-buffer: register window i+1 while window i copies
    struct Live { void* p; size_t len; bool on; } prev{nullptr, 0, false};
    for (;;) {
      size_t i = next++; if (i >= ws.size()) break;
      double a = now();
      void* p = mmap(nullptr, ws[i].len, PROT_READ, MAP_SHARED | (populate ? MAP_POPULATE : 0), files[ws[i].f].fd, ws[i].off);
      if (p == MAP_FAILED) { perror("mmap"); exit(1); }
      double b = now(); tmap[t] += b - a;
      CK(cuMemHostRegister_v2(p, ws[i].len, flags));
      double c = now(); treg[t] += c - b;
      if (prev.on) { CK(cuStreamSynchronize(st)); double e = now(); tcopy[t] += e - c; CK(cuMemHostUnregister(prev.p)); munmap(prev.p, prev.len); tunreg[t] += now() - e; }
      for (size_t o = 0; o < ws[i].len; o += C) CK(cuMemcpyHtoDAsync_v2(dbuf + ws[i].dst + o, (char*)p + o, std::min(C, ws[i].len - o), st));
      prev = {p, ws[i].len, true};
    }
    if (prev.on) { double c = now(); CK(cuStreamSynchronize(st)); double e = now(); tcopy[t] += e - c; CK(cuMemHostUnregister(prev.p)); munmap(prev.p, prev.len); tunreg[t] += now() - e; }
    CK(cuStreamDestroy_v2(st));
  });
  for (auto& x : th) x.join();
  CK(cuCtxSynchronize());
  double t = now() - t0; double m = 0, r = 0, c = 0, u = 0; for (int i = 0; i < T; ++i) { m += tmap[i]; r += treg[i]; c += tcopy[i]; u += tunreg[i]; }
  printf("direct T=%d W=%zuM C=%zuM flags=%u pop=%d: %.3f s %.1f GB/s cpu %.2f sys %.2f; per thread mmap %.3f reg %.3f copywait %.3f unreg %.3f\n", T, W >> 20, C >> 20, flags, populate, t, total / t / 1e9, cpu() - c0, sys() - s0, m / T, r / T, c / T, u / T);
}

static void limit() {
  void* h; size_t B = 1ull << 30; CK(cuMemHostAlloc(&h, B, 1)); memset(h, 1, B); CUstream s; CK(cuStreamCreate(&s, 1));
  double t0 = now(); for (size_t o = 0; o < total; o += B) CK(cuMemcpyHtoDAsync_v2(dbuf + o, h, std::min(B, total - o), s)); CK(cuStreamSynchronize(s));
  double t = now() - t0; printf("limit pinned 1 GiB: %.3f s %.1f GB/s\n", t, total / t / 1e9);
  CK(cuStreamDestroy_v2(s)); CK(cuMemFreeHost(h));
}

int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s s|d|g|... FILE...\n", argv[0]); return 2; }
  void* lib = dlopen("libcuda.so.1", RTLD_NOW); if (!lib) { puts("no libcuda"); return 1; }
#define L(n) n = (decltype(n))dlsym(lib, #n); if (!n) { printf("no %s\n", #n); return 1; }
  L(cuInit) L(cuDeviceGet) L(cuDevicePrimaryCtxRetain) L(cuCtxSetCurrent) L(cuMemAlloc_v2) L(cuMemHostAlloc) L(cuMemHostRegister_v2)
  L(cuMemHostUnregister) L(cuMemcpyHtoDAsync_v2) L(cuStreamCreate) L(cuStreamSynchronize) L(cuEventCreate) L(cuEventRecord) L(cuEventSynchronize) L(cuCtxSynchronize) L(cuMemFreeHost) L(cuStreamDestroy_v2) L(cuEventDestroy_v2)
  CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&ctx, dev)); CK(cuCtxSetCurrent(ctx));
  for (int i = 2; i < argc; ++i) { File f; f.path = argv[i]; f.fd = open(argv[i], O_RDONLY); if (f.fd < 0) { perror(argv[i]); return 1; } struct stat st; if (fstat(f.fd, &st) != 0) { perror(argv[i]); return 1; } f.size = st.st_size; files.push_back(f); total += f.size; }
  CK(cuMemAlloc_v2(&dbuf, total + (64 << 20)));
  printf("%zu files, %.1f GB\n", files.size(), total / 1e9);
  std::string mode = argv[1];
  if (mode.find_first_not_of("sdgha") != std::string::npos) { fprintf(stderr, "mode: s, d, g, h, a or a mix\n"); return 2; }
  limit();
  if (mode.find('s') != std::string::npos) {
    ring(16, 16, 8 << 20);
    for (int rep = 0; rep < 2; ++rep) {
      ring(16, 16, 8 << 20); ring(16, 8, 8 << 20); ring(8, 8, 8 << 20); ring(12, 12, 8 << 20);
      ring(16, 16, 4 << 20); ring(16, 32, 4 << 20); ring(16, 32, 2 << 20); ring(16, 16, 2 << 20); ring(8, 16, 4 << 20);
      ring(16, 16, 1 << 20); ring(16, 64, 1 << 20); ring(16, 24, 8 << 20);
    }
  }
  if (mode.find('g') != std::string::npos) {  // gathered reads: K per 4 MiB slot, as per-expert tensors fill one
    ring(16, 32, 4 << 20);
    for (int rep = 0; rep < 2; ++rep) {
      ring(16, 32, 4 << 20); ring(16, 32, 4 << 20, 4, false); ring(16, 32, 4 << 20, 4, true);
      ring(16, 32, 4 << 20, 4, true, 256); ring(16, 32, 4 << 20, 2, true); ring(16, 64, 4 << 20, 4, true);
      ring(16, 32, 4 << 20, 1, false, 0, true); ring(16, 32, 4 << 20, 4, true, 256, true);
    }
  }
  if (mode.find('a') != std::string::npos) {  // alignment: a safetensors file's data start at 8 + its header's
    // length, a multiple of 8, so a tensor's bytes usually lie 8..56 bytes past a cache line while the slot
    // they are read into starts on one: the kernel's copy out of the page cache is then mutually misaligned
    for (int rep = 0; rep < 3; ++rep) {
      ring(16, 32, 4 << 20, 4, true, 256, true); ring(16, 32, 4 << 20, 4, true, 264, true);
      ring(16, 32, 4 << 20, 1, false, 0, true); ring(16, 32, 4 << 20, 1, false, 8, true);
    }
  }
  if (mode.find('h') != std::string::npos)  // hf2q's FP8 load, short enough to profile: what g's last case reads
    for (int rep = 0; rep < 4; ++rep) ring(16, 32, 4 << 20, 4, true, 256, true);
  if (mode.find('d') != std::string::npos) {
    direct(4, 256 << 20, 64 << 20, 8, false); direct(4, 256 << 20, 64 << 20, 8, false);
    direct(8, 256 << 20, 64 << 20, 8, false); direct(16, 128 << 20, 32 << 20, 8, false);
    direct(8, 1024 << 20, 64 << 20, 8, false); direct(4, 64 << 20, 16 << 20, 8, false); direct(8, 64 << 20, 16 << 20, 8, false);
    direct(8, 256 << 20, 64 << 20, 8, true);
  }
  limit();
  return 0;
}
