// The demo program `cargo xtask demo` traces: a few threads doing recognisable work (a recursive
// Fibonacci, a prime sieve, string hashing through a tail call) so the report has shape.
// Built with clang++-19 -O2 -fxray-instrument -fxray-instruction-threshold=1; it links no XRay
// runtime calls of its own: fdr-profiled traces it from the outside.
#include <pthread.h>
#include <stdio.h>
#include <string.h>

namespace demo {

__attribute__((noinline)) unsigned long fib(unsigned n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

__attribute__((noinline)) unsigned count_primes(unsigned limit) {
  static thread_local bool composite[20000];
  memset(composite, 0, sizeof composite);
  unsigned count = 0;
  for (unsigned i = 2; i < limit && i < 20000; i++) {
    if (composite[i]) continue;
    count++;
    for (unsigned j = i * 2; j < limit && j < 20000; j += i) composite[j] = true;
  }
  return count;
}

__attribute__((noinline)) unsigned mix(unsigned h, unsigned char c) { return (h ^ c) * 16777619u; }

__attribute__((noinline)) unsigned hash_tail(const char *s, unsigned h) {
  if (*s == 0) return h;
  return hash_tail(s + 1, mix(h, (unsigned char)*s));  // a tail call: XRay puts a TAIL sled here
}

[[clang::xray_log_args(1)]] __attribute__((noinline)) unsigned hash(const char *s) { return hash_tail(s, 2166136261u); }

}  // namespace demo

static void *worker(void *arg) {
  unsigned id = (unsigned)(unsigned long)arg;
  unsigned long sink = 0;
  for (unsigned round = 0; round < 20; round++) {
    sink += demo::fib(12 + id);
    sink += demo::count_primes(2000 + 500 * id);
    sink += demo::hash("fdr-profiled traces XRay sleds from the outside");
  }
  printf("worker %u done (%lu)\n", id, sink);
  return nullptr;
}

int main() {
  pthread_t threads[3];
  for (unsigned i = 0; i < 3; i++) pthread_create(&threads[i], nullptr, worker, (void *)(unsigned long)i);
  for (auto &t : threads) pthread_join(t, nullptr);
  return 0;
}
