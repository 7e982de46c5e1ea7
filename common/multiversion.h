// Function multiversioning for hot loops (GCC target_clones): an x86-64-v3 clone (AVX2, FMA,
// F16C) and a baseline clone, chosen at load time by an ifunc resolver, so the shipped build
// never needs -march=native. "arch=x86-64-v3", not "arch=haswell": GCC's resolver tests an
// arch=<cpu> clone with __builtin_cpu_is (the CPU model), so haswell would match Haswell
// only; x86-64-v3 is tested as a feature level (transport/reduce.cc says more).
#ifndef BRAID_COMMON_MULTIVERSION_H_
#define BRAID_COMMON_MULTIVERSION_H_

//
// Not under ThreadSanitizer (gcc defines __SANITIZE_THREAD__): the resolver runs while the
// program is being loaded, before TSan's runtime is up, and TSan-instrumented it crashes.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define BRAID_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define BRAID_MULTIVERSION
#endif

#endif  // BRAID_COMMON_MULTIVERSION_H_
