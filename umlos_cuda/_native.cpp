// umlos_cuda._native: the kernel headers (kernels/*.cuh) compiled by the host
// C++ compiler into a CPython extension, for backend "native".
//
// One section per sampling mode (umlos_cuda/modes/ names these functions as the
// mode's native entry points; the two Feistel modes share one), and Philox: the known answers and the RNG
// sub-streams' blocks (umlos_cuda.rng).
// Plain CPython C API and the buffer protocol (_native_api.h: no NumPy headers,
// so building needs only a C++ compiler). The GIL is released while computing;
// OpenMP spreads positions and blocks over the cores. Arguments are validated
// here as well as in Python: a wrong buffer raises ValueError/TypeError, never
// writes out of bounds. Every function computes exactly what umlos_cuda.reference does.
//
// Fork safety: GCC's OpenMP runtime cannot start a parallel region in a child
// created by fork() after the parent ran one (the child would wait forever for
// the parent's worker threads). Data loaders fork workers, so a forked child
// runs every loop serially (same results, one core).
#include "_native_api.h"

#if !defined(_WIN32)
#include <pthread.h>
#endif

#include <cstring>
#include <new>

#include "block_feistel.cuh"

#if defined(_OPENMP)
#include <omp.h>
#endif

using umlos::u32;
using umlos::u64;
using umlos_native::Buffer;
using umlos_native::KIND_I32;
using umlos_native::KIND_I64;
using umlos_native::KIND_OTHER;
using umlos_native::KIND_U64;
using umlos_native::Kind;
using umlos_native::buffer_kind;
using umlos_native::check_length;
using umlos_native::get_buffer;
using umlos_native::get_window;
using umlos_native::to_u32;
using umlos_native::to_u64;

namespace {

volatile int g_forked = 0;

void on_fork_child() { g_forked = 1; }

// Below this much work a loop runs serially: waking threads costs more.
constexpr u64 kParallelMin = 1u << 15;

inline bool parallel_ok(u64 work) {
#if defined(_OPENMP)
    return !g_forked && work >= kParallelMin && omp_get_max_threads() > 1;
#else
    (void)work;
    return false;
#endif
}

// ---------------------------------------------------------------- block_affine: work

void fill_block_permute_j(u64 num_full_blocks, umlos::EpochKey ek, u64* j) {
    const long long count = (long long)num_full_blocks;
    if (parallel_ok(num_full_blocks * 8)) {
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < count; ++i) j[i] = umlos::block_permute_j((u64)i, ek);
    } else {
        for (long long i = 0; i < count; ++i) j[i] = umlos::block_permute_j((u64)i, ek);
    }
}

void fill_affine_params(const u64* ids, u64 count, u64 n, u64 block_size, umlos::EpochKey ek, u64* base, u64* m,
                        u64* a, u64* c) {
    auto one = [&](long long i) {
        const umlos::BlockParams p = umlos::block_affine_params(ids[i], n, block_size, ek);
        base[i] = p.base;
        m[i] = p.m;
        a[i] = p.a;
        c[i] = p.c;
    };
    const long long total = (long long)count;
    if (parallel_ok(count * 8)) {
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < total; ++i) one(i);
    } else {
        for (long long i = 0; i < total; ++i) one(i);
    }
}

// Positions start + i * stride for i in [lo, hi) into out[lo, hi): block runs,
// each mapped incrementally.
template <typename T>
void map_span(const umlos::PlanView& plan, u64 start, u64 stride, u64 lo, u64 hi, T* out) {
    u64 i = lo;
    while (i < hi) {
        const u64 p = start + i * stride;
        const u64 b = umlos::divider_divide(p, plan.block);
        const u64 l = p - b * plan.block.d;
        // Positions of this stride left in the block, p included.
        const u64 left_in_block = stride == 1 ? plan.block.d - l : (plan.block.d - l - 1) / stride + 1;
        const u64 run = (hi - i) < left_in_block ? (hi - i) : left_in_block;
        umlos::map_run(plan.base[b], plan.m[b], plan.a[b], plan.c[b], l, stride, run, out + i);
        i += run;
    }
}

// Chunks of this many positions are the unit of work of the parallel map.
constexpr u64 kMapChunk = 1u << 16;

// span(lo, hi) over [0, count) in chunks, on every core when the work is large enough and
// there is more than one chunk (a parallel region around one chunk only wakes the threads: on a
// busy machine that costs milliseconds, against 0.1 ms for a 2^16-position window of a plan).
template <typename Span>
void for_spans(u64 count, Span span) {
    if (!parallel_ok(count) || count <= kMapChunk) {
        span((u64)0, count);
        return;
    }
    const long long chunks = (long long)((count + kMapChunk - 1) / kMapChunk);
#pragma omp parallel for schedule(static)
    for (long long k = 0; k < chunks; ++k) {
        const u64 lo = (u64)k * kMapChunk;
        const u64 hi = count - lo < kMapChunk ? count : lo + kMapChunk;
        span(lo, hi);
    }
}

template <typename T>
void map_all(const umlos::PlanView& plan, u64 start, u64 count, u64 stride, T* out) {
    for_spans(count, [&](u64 lo, u64 hi) { map_span(plan, start, stride, lo, hi, out); });
}

// Calls fn(out) with `out` the buffer's data as its element type (u64, i64 or i32).
template <typename Fn>
void with_output(const Buffer& out, Fn fn) {
    const Kind kind = buffer_kind(out.view);
    if (kind == KIND_U64) {
        fn(out.data<unsigned long long>());
    } else if (kind == KIND_I64) {
        fn(out.data<long long>());
    } else {
        fn(out.data<umlos::i32>());
    }
}

// R5 for full blocks into `order` (its draws in j), then the permuted block id of every
// virtual block: `order` itself without a tail, else `ids` (blocks entries: order, then
// the tail block, which stays last). Shared by the plan builders of the block modes.
const u64* permute_blocks(u64 full, u64 blocks, umlos::EpochKey ek, u64* j, u64* order, u64* ids) {
    fill_block_permute_j(full, ek, j);
    umlos::seeded_block_permute(full, j, order);
    if (blocks == full) return order;
    for (u64 i = 0; i < full; ++i) ids[i] = order[i];
    ids[full] = full;  // the short tail block stays last (R5)
    return ids;
}

// The divider of block_size, which must match the (magic, info) the caller passed
// (divider_params); false with ValueError set otherwise.
bool checked_divider(u64 block_size, u64 magic, u32 info, umlos::Divider* divider) {
    if (block_size == 0) {
        PyErr_SetString(PyExc_ValueError, "block_size must be at least 1");
        return false;
    }
    *divider = umlos::divider_make(block_size);
    if (divider->magic != magic || divider->info != info) {
        PyErr_SetString(PyExc_ValueError, "block_magic and block_info must be divider_params(block_size)");
        return false;
    }
    return true;
}

// A window of a block mode ends at position `last`: its block must be one of the
// tables' `blocks`, and `last` inside it (m[b] positions); false with ValueError set otherwise.
bool window_inside_blocks(u64 last, u64 block_size, u64 blocks, const u64* m) {
    const u64 last_block = last / block_size;
    if (last_block >= blocks) {
        PyErr_Format(PyExc_ValueError, "positions up to %llu need %llu blocks; the tables have %llu",
                     (unsigned long long)last, (unsigned long long)(last_block + 1), (unsigned long long)blocks);
        return false;
    }
    if (last - last_block * block_size >= m[last_block]) {
        PyErr_Format(PyExc_ValueError, "position %llu is past the end of its block (m = %llu)", (unsigned long long)last,
                     (unsigned long long)m[last_block]);
        return false;
    }
    return true;
}

// ---------------------------------------------------------------- block_affine: Python functions

// build_plan(n, block_size, k0, k1, w2, w3, order, base, m, a, c): the whole epoch plan.
// order has n // block_size elements; the tables have one more when a tail exists.
PyObject* py_build_plan(PyObject*, PyObject* args) {
    u64 n, block_size;
    u32 k0, k1, w2, w3;
    PyObject *order_obj, *base_obj, *m_obj, *a_obj, *c_obj;
    if (!PyArg_ParseTuple(args, "O&O&O&O&O&O&OOOOO:build_plan", to_u64, &n, to_u64, &block_size, to_u32, &k0, to_u32,
                          &k1, to_u32, &w2, to_u32, &w3, &order_obj, &base_obj, &m_obj, &a_obj, &c_obj)) {
        return nullptr;
    }
    if (block_size == 0 || n == 0) {
        PyErr_SetString(PyExc_ValueError, "n and block_size must be at least 1");
        return nullptr;
    }
    const u64 full = n / block_size;
    const u64 blocks = full + (n % block_size ? 1 : 0);
    Buffer order, base, m, a, c;
    if (!get_buffer(order_obj, order, true, KIND_U64, "order") || !check_length(order, full, "order") ||
        !get_buffer(base_obj, base, true, KIND_U64, "base") || !check_length(base, blocks, "base") ||
        !get_buffer(m_obj, m, true, KIND_U64, "m") || !check_length(m, blocks, "m") ||
        !get_buffer(a_obj, a, true, KIND_U64, "a") || !check_length(a, blocks, "a") ||
        !get_buffer(c_obj, c, true, KIND_U64, "c") || !check_length(c, blocks, "c")) {
        return nullptr;
    }
    // The draws j go into `base` (same length or longer), which is overwritten afterwards.
    u64* j = base.data<u64>();
    u64* ord = order.data<u64>();
    u64* ids = nullptr;
    if (blocks != full) {
        ids = new (std::nothrow) u64[blocks];
        if (!ids) return PyErr_NoMemory();
    }
    const umlos::EpochKey ek = umlos::make_epoch_key(k0, k1, w2, w3);
    Py_BEGIN_ALLOW_THREADS;
    const u64* perm = permute_blocks(full, blocks, ek, j, ord, ids);
    fill_affine_params(perm, blocks, n, block_size, ek, base.data<u64>(), m.data<u64>(), a.data<u64>(),
                       c.data<u64>());
    Py_END_ALLOW_THREADS;
    delete[] ids;
    Py_RETURN_NONE;
}

// map_positions(base, m, a, c, block_size, block_magic, block_info, start, count, stride, out):
// train positions start + i * stride, i < count, to indices (the map entry point, _native_api.h).
PyObject* py_map_positions(PyObject*, PyObject* args) {
    PyObject *base_obj, *m_obj, *a_obj, *c_obj, *out_obj;
    u64 block_size, block_magic, start, count, stride;
    u32 block_info;
    if (!PyArg_ParseTuple(args, "OOOOO&O&O&O&O&O&O:map_positions", &base_obj, &m_obj, &a_obj, &c_obj, to_u64,
                          &block_size, to_u64, &block_magic, to_u32, &block_info, to_u64, &start, to_u64, &count,
                          to_u64, &stride, &out_obj)) {
        return nullptr;
    }
    umlos::Divider divider;
    if (!checked_divider(block_size, block_magic, block_info, &divider)) return nullptr;
    Buffer base, m, a, c, out;
    u64 last;
    if (!get_buffer(base_obj, base, false, KIND_U64, "base") || !get_buffer(m_obj, m, false, KIND_U64, "m") ||
        !get_buffer(a_obj, a, false, KIND_U64, "a") || !get_buffer(c_obj, c, false, KIND_U64, "c") ||
        !get_window(out_obj, out, start, count, stride, &last)) {
        return nullptr;
    }
    if (count == 0) Py_RETURN_NONE;
    const u64 blocks = base.length();
    if (m.length() < blocks || a.length() < blocks || c.length() < blocks) {
        PyErr_SetString(PyExc_ValueError, "the tables base, m, a and c must have the same length");
        return nullptr;
    }
    // The last block may be short; positions must stay inside it.
    if (!window_inside_blocks(last, block_size, blocks, m.data<u64>())) return nullptr;
    umlos::PlanView plan;
    plan.base = base.data<u64>();
    plan.m = m.data<u64>();
    plan.a = a.data<u64>();
    plan.c = c.data<u64>();
    plan.block = divider;
    Py_BEGIN_ALLOW_THREADS;
    with_output(out, [&](auto* target) { map_all(plan, start, count, stride, target); });
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

// ---------------------------------------------------------------- Feistel modes: work
//
// The bijection is evaluated with SIMD: each 64-bit lane holds a half
// (< 2^32), so a round's 32x32 -> 64-bit multiply is one pmuludq per 2, 4 or 8
// lanes (SSE2, AVX2, AVX-512F; the fastest the CPU has is picked at run time),
// 32 or 64 values per step so that enough independent multiplies are in
// flight. The compiler does not vectorise umlos::feistel_encrypt well by
// itself (the widening multiply becomes shuffles: 3.4 ns a value against 0.6
// with AVX-512 here), so the lanes are written with GCC/Clang vector types;
// other compilers and CPUs run the header's scalar function. Every path
// computes the same bits. Cycle-walking keeps the values still >= n in a
// compacted list and walks them in lanes too, so lanes do not wait for the
// longest walk; the last few stragglers finish one by one.

constexpr u32 kLanes = 64;        // every lane function takes a multiple of this many values
constexpr u32 kWalkChunk = 1024;  // values walked together (a multiple of kLanes)
constexpr u32 kScalarWalk = 16;   // fewer pending values than this finish with the scalar function

inline u32 round_up_lanes(u32 count) { return (count + kLanes - 1) / kLanes * kLanes; }
inline u32 round_up_16(u32 count) { return (count + 15) / 16 * 16; }

typedef void (*FeistelLanes)(const umlos::FeistelKey& key, u64* v, u32 count);
// Keeps ids[q] for the q < count with v[q] >= n, in order, at the front of ids (in place);
// returns how many. count is a multiple of 16; ids has room for it.
typedef u32 (*FeistelFilter)(const u64* v, u32 count, u64 n, u32* ids);

u32 feistel_filter_scalar(const u64* v, u32 count, u64 n, u32* ids) {
    u32 kept = 0;
    for (u32 q = 0; q < count; ++q) {
        ids[kept] = ids[q];
        kept += v[q] >= n ? 1u : 0u;
    }
    return kept;
}

// Any compiler, any CPU: the header's function value by value.
void feistel_encrypt_scalar(const umlos::FeistelKey& key, u64* v, u32 count) {
    for (u32 j = 0; j < count; ++j) v[j] = umlos::feistel_encrypt(v[j], key);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define UMLOS_FEISTEL_SIMD 1
#include <immintrin.h>

// umlos::feistel_encrypt over v[0..count), count a multiple of kLanes, STEP
// values at a time in vectors of BYTES bytes; MUL(x, y) multiplies the low 32
// bits of each 64-bit lane.
#define UMLOS_FEISTEL_LANES(NAME, TARGET, BYTES, STEP, MUL)                                 \
    TARGET void NAME(const umlos::FeistelKey& key, u64* v, u32 count) {                     \
        typedef u64 vec __attribute__((vector_size(BYTES)));                                \
        constexpr u32 W = BYTES / 8, R = STEP / W;                                          \
        static_assert(kLanes % STEP == 0, "a step divides kLanes");                         \
        const u32 low = key.low;                                                            \
        const u64 low_mask = 0xFFFFFFFFull >> (32u - low);                                  \
        const u32 shift_high = 64u - key.high, shift_low = 64u - low;                       \
        const vec m = (vec){} + (u64)umlos::FEISTEL_M;                                      \
        for (u32 base = 0; base < count; base += STEP) {                                    \
            vec a[R], b[R];                                                                 \
            for (u32 r = 0; r < R; ++r) {                                                   \
                vec x;                                                                      \
                std::memcpy(&x, v + base + r * W, BYTES);                                   \
                a[r] = x >> low;                                                            \
                b[r] = x & low_mask;                                                        \
            }                                                                               \
            for (int i = 0; i < umlos::FEISTEL_ROUNDS; i += 2) {                            \
                const u64 k_even = key.k[i], k_odd = key.k[i + 1];                          \
                for (u32 r = 0; r < R; ++r) {                                               \
                    const vec p = MUL(b[r] ^ k_even, m);                                    \
                    a[r] ^= ((p << 32) ^ p) >> shift_high;                                  \
                    const vec q = MUL(a[r] ^ k_odd, m);                                     \
                    b[r] ^= ((q << 32) ^ q) >> shift_low;                                   \
                }                                                                           \
            }                                                                               \
            for (u32 r = 0; r < R; ++r) {                                                   \
                const vec x = (a[r] << low) | b[r];                                         \
                std::memcpy(v + base + r * W, &x, BYTES);                                   \
            }                                                                               \
        }                                                                                   \
    }

#define UMLOS_MUL_SSE2(x, y) ((vec)_mm_mul_epu32((__m128i)(x), (__m128i)(y)))
#define UMLOS_MUL_AVX2(x, y) ((vec)_mm256_mul_epu32((__m256i)(x), (__m256i)(y)))
#define UMLOS_MUL_AVX512(x, y) ((vec)_mm512_mul_epu32((__m512i)(x), (__m512i)(y)))

// Steps measured best on an AMD EPYC (Zen 4): SSE2 spills past 32 values, AVX2 and AVX-512 gain up to 64.
UMLOS_FEISTEL_LANES(feistel_encrypt_sse2, , 16, 32, UMLOS_MUL_SSE2)
UMLOS_FEISTEL_LANES(feistel_encrypt_avx2, __attribute__((target("avx2"))), 32, 64, UMLOS_MUL_AVX2)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // _mm512_undefined_epi32 inside the intrinsic (GCC 12)
#endif
UMLOS_FEISTEL_LANES(feistel_encrypt_avx512, __attribute__((target("avx512f"))), 64, 64, UMLOS_MUL_AVX512)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// feistel_filter_scalar with AVX-512F: 16 compares into a mask, one compressing store.
__attribute__((target("avx512f"))) u32 feistel_filter_avx512(const u64* v, u32 count, u64 n, u32* ids) {
    const __m512i limit = _mm512_set1_epi64((long long)n);
    u32 kept = 0;
    for (u32 q = 0; q < count; q += 16) {
        const __mmask8 low = _mm512_cmpge_epu64_mask(_mm512_loadu_si512(v + q), limit);
        const __mmask8 high = _mm512_cmpge_epu64_mask(_mm512_loadu_si512(v + q + 8), limit);
        const __mmask16 mask = (__mmask16)((unsigned)low | ((unsigned)high << 8));
        _mm512_mask_compressstoreu_epi32(ids + kept, mask, _mm512_loadu_si512(ids + q));
        kept += (u32)__builtin_popcount((unsigned)mask);
    }
    return kept;
}
#endif

struct FeistelIsa {
    const char* name;
    FeistelLanes lanes;
    FeistelFilter filter;
};

// The instruction sets this build has a path for, fastest first; "scalar" is always last.
const FeistelIsa kFeistelIsas[] = {
#if defined(UMLOS_FEISTEL_SIMD)
    {"avx512f", feistel_encrypt_avx512, feistel_filter_avx512},
    {"avx2", feistel_encrypt_avx2, feistel_filter_scalar},
    {"sse2", feistel_encrypt_sse2, feistel_filter_scalar},
#endif
    {"scalar", feistel_encrypt_scalar, feistel_filter_scalar},
};
constexpr int kFeistelIsaCount = (int)(sizeof(kFeistelIsas) / sizeof(kFeistelIsas[0]));

bool isa_supported(const char* name) {
#if defined(UMLOS_FEISTEL_SIMD)
    __builtin_cpu_init();
    if (std::strcmp(name, "avx512f") == 0) return __builtin_cpu_supports("avx512f");
    if (std::strcmp(name, "avx2") == 0) return __builtin_cpu_supports("avx2");
#else
    (void)name;
#endif
    return true;  // sse2 is x86-64's baseline; scalar runs anywhere
}

// The path in use: the fastest supported one, until feistel_isa() picks another.
int g_feistel_isa = -1;

const FeistelIsa& feistel_isa() {
    if (g_feistel_isa < 0) {
        int pick = kFeistelIsaCount - 1;
        for (int i = 0; i < kFeistelIsaCount; ++i) {
            if (isa_supported(kFeistelIsas[i].name)) {
                pick = i;
                break;
            }
        }
        g_feistel_isa = pick;
    }
    return kFeistelIsas[g_feistel_isa];
}

// umlos::feistel_permute of v[0..count) in place, count <= kWalkChunk; v has room
// for round_up_lanes(count) values.
void feistel_permute_lanes(const umlos::FeistelKey& key, u64* v, u32 count) {
    const FeistelIsa& isa = feistel_isa();
    const u32 padded = round_up_lanes(count);
    for (u32 j = count; j < padded; ++j) v[j] = 0;
    isa.lanes(key, v, padded);
    u32 scan = round_up_16(count);
    for (u32 j = count; j < scan; ++j) v[j] = 0;  // padding lanes read as in range: the filter drops them
    u32 idx[kWalkChunk];
    u64 walk[kWalkChunk];
    for (u32 j = 0; j < scan; ++j) idx[j] = j;
    u32 pending = isa.filter(v, scan, key.n, idx);
    while (pending >= kScalarWalk) {
        const u32 lanes = round_up_lanes(pending);
        for (u32 q = 0; q < lanes; ++q) walk[q] = q < pending ? v[idx[q]] : 0;
        isa.lanes(key, walk, lanes);
        for (u32 q = 0; q < pending; ++q) v[idx[q]] = walk[q];
        scan = round_up_16(pending);
        for (u32 q = pending; q < scan; ++q) walk[q] = 0;
        pending = isa.filter(walk, scan, key.n, idx);
    }
    for (u32 q = 0; q < pending; ++q) {
        u64 y = v[idx[q]];
        while (y >= key.n) y = umlos::feistel_encrypt(y, key);
        v[idx[q]] = y;
    }
}

// out[i] = offset + permute(first + i * step) for i < count, kWalkChunk at a time.
// A whole chunk of uint64 output is computed in place in `out` (no copy).
template <typename T>
void feistel_map_run(const umlos::FeistelKey& key, u64 offset, u64 first, u64 step, u64 count, T* out) {
    if (count < kLanes) {  // a short run (a strided window over small blocks): no lanes to fill
        for (u64 i = 0; i < count; ++i) out[i] = (T)(offset + umlos::feistel_permute(first + i * step, key));
        return;
    }
    u64 buffer[kWalkChunk];
    for (u64 i = 0; i < count; i += kWalkChunk) {
        const u32 chunk = count - i < kWalkChunk ? (u32)(count - i) : kWalkChunk;
        const bool in_place = sizeof(T) == sizeof(u64) && chunk == kWalkChunk;
        u64* v = in_place ? reinterpret_cast<u64*>(out + i) : buffer;
        const u64 p0 = first + i * step;
        if (step == 1) {
            for (u32 j = 0; j < chunk; ++j) v[j] = p0 + j;
        } else {
            for (u32 j = 0; j < chunk; ++j) v[j] = p0 + j * step;
        }
        feistel_permute_lanes(key, v, chunk);
        if (in_place) {
            if (offset != 0) {
                for (u32 j = 0; j < chunk; ++j) v[j] += offset;
            }
        } else {
            for (u32 j = 0; j < chunk; ++j) out[i + j] = (T)(offset + v[j]);
        }
    }
}

// block_feistel: positions start + i * stride for i in [lo, hi) into out[lo, hi), one block run at a time.
template <typename T>
void block_feistel_span(const umlos::BlockFeistelView& plan, u64 start, u64 stride, u64 lo, u64 hi, T* out) {
    u64 i = lo;
    while (i < hi) {
        const u64 p = start + i * stride;
        const u64 b = umlos::divider_divide(p, plan.block);
        const u64 l = p - b * plan.block.d;
        const u64 left_in_block = (plan.m[b] - l - 1) / stride + 1;
        const u64 run = (hi - i) < left_in_block ? (hi - i) : left_in_block;
        feistel_map_run(umlos::block_feistel_key(plan, b), plan.base[b], l, stride, run, out + i);
        i += run;
    }
}

void fill_block_feistel_params(const u64* ids, u64 count, u64 n, u64 block_size, umlos::EpochKey ek, u64* base,
                               u64* m, u64* const k[umlos::FEISTEL_KEY_WORDS]) {
    auto one = [&](long long i) {
        const umlos::BlockFeistelParams p = umlos::block_feistel_params(ids[i], n, block_size, ek);
        base[i] = p.base;
        m[i] = p.m;
        for (int w = 0; w < umlos::FEISTEL_KEY_WORDS; ++w) k[w][i] = p.k[w];
    };
    const long long total = (long long)count;
    if (parallel_ok(count * 16)) {
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < total; ++i) one(i);
    } else {
        for (long long i = 0; i < total; ++i) one(i);
    }
}

// ---------------------------------------------------------------- Feistel modes: Python functions

// feistel_map(n, key0, key1, key2, key3, start, count, stride, out): train positions
// start + i * stride, i < count, of mode feistel to indices (the map entry point, _native_api.h).
PyObject* py_feistel_map(PyObject*, PyObject* args) {
    u64 n, w0, w1, w2, w3, start, count, stride;
    PyObject* out_obj;
    if (!PyArg_ParseTuple(args, "O&O&O&O&O&O&O&O&O:feistel_map", to_u64, &n, to_u64, &w0, to_u64, &w1, to_u64, &w2,
                          to_u64, &w3, to_u64, &start, to_u64, &count, to_u64, &stride, &out_obj)) {
        return nullptr;
    }
    Buffer out;
    u64 last;
    if (!get_window(out_obj, out, start, count, stride, &last)) return nullptr;
    if (count == 0) Py_RETURN_NONE;
    if (last >= n) {
        PyErr_Format(PyExc_ValueError, "position %llu is outside the epoch's %llu positions", (unsigned long long)last,
                     (unsigned long long)n);
        return nullptr;
    }
    const umlos::FeistelKey key = umlos::feistel_make_key(n, w0, w1, w2, w3);
    Py_BEGIN_ALLOW_THREADS;
    with_output(out, [&](auto* target) {
        for_spans(count, [&](u64 lo, u64 hi) { feistel_map_run(key, 0, start + lo * stride, stride, hi - lo, target + lo); });
    });
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

// block_feistel_build_plan(n, block_size, k0, k1, w2, w3, order, base, m, key0, key1, key2, key3):
// R5's block order and each virtual block's base, length and round keys.
PyObject* py_block_feistel_build_plan(PyObject*, PyObject* args) {
    u64 n, block_size;
    u32 k0, k1, w2, w3;
    PyObject* objs[7];
    if (!PyArg_ParseTuple(args, "O&O&O&O&O&O&OOOOOOO:block_feistel_build_plan", to_u64, &n, to_u64, &block_size,
                          to_u32, &k0, to_u32, &k1, to_u32, &w2, to_u32, &w3, &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], &objs[6])) {
        return nullptr;
    }
    if (block_size == 0 || n == 0) {
        PyErr_SetString(PyExc_ValueError, "n and block_size must be at least 1");
        return nullptr;
    }
    const u64 full = n / block_size;
    const u64 blocks = full + (n % block_size ? 1 : 0);
    static const char* const names[7] = {"order", "base", "m", "key0", "key1", "key2", "key3"};
    Buffer bufs[7];
    for (int t = 0; t < 7; ++t) {
        if (!get_buffer(objs[t], bufs[t], true, KIND_U64, names[t]) ||
            !check_length(bufs[t], t == 0 ? full : blocks, names[t])) {
            return nullptr;
        }
    }
    u64* ord = bufs[0].data<u64>();
    u64* j = bufs[1].data<u64>();  // the draws j go into `base`, overwritten afterwards
    u64* ids = nullptr;
    if (blocks != full) {
        ids = new (std::nothrow) u64[blocks];
        if (!ids) return PyErr_NoMemory();
    }
    u64* const keys[umlos::FEISTEL_KEY_WORDS] = {bufs[3].data<u64>(), bufs[4].data<u64>(), bufs[5].data<u64>(),
                                                 bufs[6].data<u64>()};
    const umlos::EpochKey ek = umlos::make_epoch_key(k0, k1, w2, w3);
    Py_BEGIN_ALLOW_THREADS;
    const u64* perm = permute_blocks(full, blocks, ek, j, ord, ids);
    fill_block_feistel_params(perm, blocks, n, block_size, ek, bufs[1].data<u64>(), bufs[2].data<u64>(), keys);
    Py_END_ALLOW_THREADS;
    delete[] ids;
    Py_RETURN_NONE;
}

// block_feistel_map(base, m, key0, key1, key2, key3, block_size, block_magic, block_info, start, count, stride, out).
PyObject* py_block_feistel_map(PyObject*, PyObject* args) {
    PyObject* objs[6];
    PyObject* out_obj;
    u64 block_size, block_magic, start, count, stride;
    u32 block_info;
    if (!PyArg_ParseTuple(args, "OOOOOOO&O&O&O&O&O&O:block_feistel_map", &objs[0], &objs[1], &objs[2], &objs[3],
                          &objs[4], &objs[5], to_u64, &block_size, to_u64, &block_magic, to_u32, &block_info, to_u64,
                          &start, to_u64, &count, to_u64, &stride, &out_obj)) {
        return nullptr;
    }
    umlos::Divider divider;
    if (!checked_divider(block_size, block_magic, block_info, &divider)) return nullptr;
    static const char* const names[6] = {"base", "m", "key0", "key1", "key2", "key3"};
    Buffer tables[6], out;
    for (int t = 0; t < 6; ++t) {
        if (!get_buffer(objs[t], tables[t], false, KIND_U64, names[t])) return nullptr;
    }
    u64 last;
    if (!get_window(out_obj, out, start, count, stride, &last)) return nullptr;
    if (count == 0) Py_RETURN_NONE;
    const u64 blocks = tables[0].length();
    for (int t = 1; t < 6; ++t) {
        if (tables[t].length() < blocks) {
            PyErr_Format(PyExc_ValueError, "%s has %llu elements; base has %llu", names[t],
                         (unsigned long long)tables[t].length(), (unsigned long long)blocks);
            return nullptr;
        }
    }
    const u64* m = tables[1].data<u64>();
    if (!window_inside_blocks(last, block_size, blocks, m)) return nullptr;
    for (u64 b = 0; b < blocks; ++b) {
        if (m[b] == 0 || m[b] > block_size) {
            PyErr_Format(PyExc_ValueError, "block %llu has length %llu, outside [1, block_size]", (unsigned long long)b,
                         (unsigned long long)m[b]);
            return nullptr;
        }
    }
    umlos::BlockFeistelView plan;
    plan.base = tables[0].data<u64>();
    plan.m = m;
    plan.k0 = tables[2].data<u64>();
    plan.k1 = tables[3].data<u64>();
    plan.k2 = tables[4].data<u64>();
    plan.k3 = tables[5].data<u64>();
    plan.block = divider;
    Py_BEGIN_ALLOW_THREADS;
    with_output(out, [&](auto* target) {
        for_spans(count, [&](u64 lo, u64 hi) { block_feistel_span(plan, start, stride, lo, hi, target); });
    });
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

// ---------------------------------------------------------------- Philox: known answers, RNG sub-streams

PyObject* py_philox4x32_10(PyObject*, PyObject* args) {
    u32 c0, c1, c2, c3, k0, k1;
    if (!PyArg_ParseTuple(args, "O&O&O&O&O&O&:philox4x32_10", to_u32, &c0, to_u32, &c1, to_u32, &c2, to_u32, &c3,
                          to_u32, &k0, to_u32, &k1)) {
        return nullptr;
    }
    umlos::PhiloxCtr ctr = {{c0, c1, c2, c3}};
    umlos::PhiloxKey key = {{k0, k1}};
    const umlos::PhiloxCtr x = umlos::philox4x32_10(ctr, key);
    return Py_BuildValue("(kkkk)", (unsigned long)x.v[0], (unsigned long)x.v[1], (unsigned long)x.v[2],
                         (unsigned long)x.v[3]);
}

// philox_stream(k0, k1, c2, c3, first_block, out): consecutive Philox4x32-10 blocks of one
// counter stream, for the RNG sub-streams (umlos_cuda.rng, docs/spec/rng.md §2). out is a
// uint32 array of 4 * count words; out[4i + j] is word j of block b = first_block + i, whose
// counter is (lo32(b), hi32(b), c2, c3) under the key (k0, k1).
PyObject* py_philox_stream(PyObject*, PyObject* args) {
    u32 k0, k1, c2, c3;
    u64 first;
    PyObject* out_obj;
    if (!PyArg_ParseTuple(args, "O&O&O&O&O&O:philox_stream", to_u32, &k0, to_u32, &k1, to_u32, &c2, to_u32, &c3,
                          to_u64, &first, &out_obj)) {
        return nullptr;
    }
    Buffer out;
    if (PyObject_GetBuffer(out_obj, &out.view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "out must be a writable contiguous array");
        return nullptr;
    }
    out.held = true;
    const char* f = out.view.format ? out.view.format : "B";
    if (*f == '@' || *f == '=' || *f == '<') ++f;
    if (out.view.ndim > 1 || out.view.itemsize != 4 || (f[0] != 'I' && f[0] != 'L') || f[1] != '\0' || out.length() % 4 != 0) {
        PyErr_SetString(PyExc_TypeError, "out must be a 1-D uint32 array of 4 words per block");
        return nullptr;
    }
    const u64 count = out.length() / 4;
    if (count && first + (count - 1) < first) {
        PyErr_SetString(PyExc_OverflowError, "first_block + count passes 2^64");
        return nullptr;
    }
    u32* words = out.data<u32>();
    const umlos::PhiloxKey key = {{k0, k1}};
    auto one = [&](long long i) {
        const u64 b = first + (u64)i;
        const umlos::PhiloxCtr ctr = {{(u32)b, (u32)(b >> 32), c2, c3}};
        const umlos::PhiloxCtr x = umlos::philox4x32_10(ctr, key);
        for (int w = 0; w < 4; ++w) words[4 * i + w] = x.v[w];
    };
    const long long total = (long long)count;
    Py_BEGIN_ALLOW_THREADS;
    if (parallel_ok(count * 4)) {
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < total; ++i) one(i);
    } else {
        for (long long i = 0; i < total; ++i) one(i);
    }
    Py_END_ALLOW_THREADS;
    Py_RETURN_NONE;
}

// feistel_isa([name]) -> the SIMD path of the Feistel modes in use; with a name
// ("avx512f", "avx2", "sse2", "scalar"), switch to it first (ValueError when this
// build or CPU has no such path). Every path gives the same bits; tests compare them.
PyObject* py_feistel_isa(PyObject*, PyObject* args) {
    const char* name = nullptr;
    if (!PyArg_ParseTuple(args, "|s:feistel_isa", &name)) return nullptr;
    if (name != nullptr) {
        int found = -1;
        for (int i = 0; i < kFeistelIsaCount; ++i) {
            if (std::strcmp(kFeistelIsas[i].name, name) == 0 && isa_supported(name)) found = i;
        }
        if (found < 0) {
            PyErr_Format(PyExc_ValueError, "no Feistel path %s in this build on this CPU", name);
            return nullptr;
        }
        g_feistel_isa = found;
    }
    return PyUnicode_FromString(feistel_isa().name);
}

PyObject* py_max_threads(PyObject*, PyObject*) {
#if defined(_OPENMP)
    return PyLong_FromLong(g_forked ? 1 : omp_get_max_threads());
#else
    return PyLong_FromLong(1);
#endif
}

PyMethodDef kMethods[] = {
    {"philox4x32_10", py_philox4x32_10, METH_VARARGS, "philox4x32_10(c0, c1, c2, c3, k0, k1) -> (x0, x1, x2, x3)"},
    {"build_plan", py_build_plan, METH_VARARGS,
     "build_plan(n, block_size, k0, k1, w2, w3, order, base, m, a, c): block order and tables of one epoch"},
    {"map_positions", py_map_positions, METH_VARARGS,
     "map_positions(base, m, a, c, block_size, block_magic, block_info, start, count, stride, out): "
     "train positions start + i * stride to indices"},
    {"feistel_map", py_feistel_map, METH_VARARGS,
     "feistel_map(n, key0, key1, key2, key3, start, count, stride, out): positions of mode feistel to indices"},
    {"block_feistel_build_plan", py_block_feistel_build_plan, METH_VARARGS,
     "block_feistel_build_plan(n, block_size, k0, k1, w2, w3, order, base, m, key0, key1, key2, key3): "
     "block order and tables of one epoch of mode block_feistel"},
    {"block_feistel_map", py_block_feistel_map, METH_VARARGS,
     "block_feistel_map(base, m, key0, key1, key2, key3, block_size, block_magic, block_info, start, count, stride, "
     "out): positions of mode block_feistel to indices"},
    {"philox_stream", py_philox_stream, METH_VARARGS,
     "philox_stream(k0, k1, c2, c3, first_block, out): Philox blocks (lo32(b), hi32(b), c2, c3) into uint32 out"},
    {"feistel_isa", py_feistel_isa, METH_VARARGS,
     "feistel_isa([name]) -> the SIMD path of the Feistel modes (avx512f, avx2, sse2 or scalar); a name switches to it"},
    {"max_threads", py_max_threads, METH_NOARGS, "threads a parallel loop uses in this process"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "umlos_cuda._native",
    "The kernel headers compiled for the host (backend \"native\"); see docs/kernels.md.", -1, kMethods,
    nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__native(void) {
    static bool registered = false;
    if (!registered) {
#if !defined(_WIN32)
        pthread_atfork(nullptr, nullptr, on_fork_child);
#endif
        registered = true;
    }
    PyObject* module = PyModule_Create(&kModule);
    if (module) {
#if defined(_OPENMP)
        PyModule_AddIntConstant(module, "openmp", 1);
#else
        PyModule_AddIntConstant(module, "openmp", 0);
#endif
    }
    return module;
}
