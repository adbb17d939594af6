// umlos_cuda._packing: first-fit, best-fit and greedy packing in O(n log n).
//
// One entry point, pack(needs, capacity, mode, rows): needs is a contiguous
// int64 array (a sequence's length plus the separator length), capacity the
// row's length plus the separator length (so a row holds separators between
// its sequences and none after the last), mode 0 first-fit, 1 best-fit,
// 2 greedy; rows (int64, as long as needs) receives each item's row, rows
// numbered in the order they are opened. Returns the number of rows.
// umlos_cuda/batching/packing/pack.py validates the input (every need at most the
// capacity) and documents the definitions; this file checks the buffers and
// that invariant again, so a wrong call raises instead of writing out of
// bounds. The Python twin is umlos_cuda/batching/packing/trees.py; the tests
// compare both with the plain O(n x rows) definitions.
//
// A second entry point, cut(lengths, budget, cap, starts, longest), is the
// batch planner's greedy pad_to_max cut (umlos_cuda/batching/plans/planner.py):
// lengths a contiguous uint32 array, a microbatch ends when the next sample
// would make count x longest exceed budget or count exceed cap (a microbatch
// always takes at least one sample); starts (int64) and longest (uint32),
// of the same length (the caller's bound on the number of microbatches),
// receive each microbatch's first position and its longest length. Returns
// the number of microbatches (ValueError if starts is too short).
//
// A third entry point, layout(tokens, masks, lengths, row_first, separator,
// input_ids, loss_mask, segment_ids, position_ids), writes the token arrays of
// packed rows (umlos_cuda/batching/packing/rows.py, whose NumPy path is its
// twin and the definition): tokens and masks are lists or tuples of 1-D
// int32 arrays, one per segment, all rows' segments in row order; row r holds
// segments [row_first[r], row_first[r + 1]); separator (int32) follows every
// segment but a row's last. The four outputs (int32, as long as all rows together)
// are written in one pass, so each output byte is touched once. Returns the
// sum of the masks (the loss tokens).
//
// A separate extension from umlos_cuda._native: it needs none of the kernel
// headers and builds (or fails to build) on its own.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <new>
#include <set>
#include <utility>
#include <vector>

namespace {

using i64 = long long;

// ---------------------------------------------------------------- first-fit
// A max segment tree over the remaining room of the rows, one leaf per row;
// leaves of rows not yet opened hold the full capacity and lie after the open
// ones, so the leftmost leaf with room >= need is the answer either way.
class FirstFit {
  public:
    FirstFit(i64 capacity, i64 expected) : cap_(capacity) {
        size_ = 1;
        while (size_ < expected && size_ < 1024) size_ <<= 1;
        tree_.assign(2 * size_, cap_);
    }

    i64 place(i64 need) {
        if (opened_ == size_) grow();
        size_t node = 1;
        const size_t size = (size_t)size_;
        while (node < size) {
            node <<= 1;
            if (tree_[node] < need) ++node;
        }
        const i64 row = (i64)(node - size);
        if (row == opened_) ++opened_;
        tree_[node] -= need;
        for (node >>= 1; node; node >>= 1) {
            const i64 best = std::max(tree_[2 * node], tree_[2 * node + 1]);
            if (tree_[node] == best) break;
            tree_[node] = best;
        }
        return row;
    }

    i64 rows() const { return opened_; }

  private:
    void grow() {
        const i64 size = size_ * 2;
        std::vector<i64> tree(2 * size, cap_);
        std::copy(tree_.begin() + size_, tree_.end(), tree.begin() + size);
        for (i64 node = size - 1; node >= 1; --node) tree[node] = std::max(tree[2 * node], tree[2 * node + 1]);
        tree_.swap(tree);
        size_ = size;
    }

    i64 cap_;
    i64 size_ = 1;
    i64 opened_ = 0;
    std::vector<i64> tree_;
};

i64 first_fit(const i64* needs, i64 n, i64 capacity, i64* rows) {
    FirstFit packer(capacity, n);
    for (i64 i = 0; i < n; ++i) rows[i] = packer.place(needs[i]);
    return packer.rows();
}

// ---------------------------------------------------------------- best-fit
// An ordered set of (remaining room, row): the first element at or after
// (need, -1) is the row with the least room that fits, ties to the lowest row.
i64 best_fit(const i64* needs, i64 n, i64 capacity, i64* rows) {
    std::set<std::pair<i64, i64>> open;
    i64 opened = 0;
    for (i64 i = 0; i < n; ++i) {
        const i64 need = needs[i];
        auto it = open.lower_bound(std::make_pair(need, (i64)-1));
        if (it == open.end()) {
            rows[i] = opened;
            open.emplace(capacity - need, opened);
            ++opened;
        } else {
            const i64 room = it->first, row = it->second;
            rows[i] = row;
            open.erase(it);
            open.emplace(room - need, row);
        }
    }
    return opened;
}

// ---------------------------------------------------------------- greedy
// A stable sort by need, largest first (a counting sort when the capacity is
// small, else std::stable_sort), then first-fit in that order.
i64 greedy(const i64* needs, i64 n, i64 capacity, i64* rows) {
    std::vector<i64> order((size_t)n);
    if (capacity <= (i64)1 << 24 && capacity <= 4 * n + 1024) {
        std::vector<i64> start((size_t)capacity + 2, 0);
        for (i64 i = 0; i < n; ++i) ++start[(size_t)(capacity - needs[i]) + 1];
        for (size_t k = 1; k < start.size(); ++k) start[k] += start[k - 1];
        for (i64 i = 0; i < n; ++i) order[(size_t)start[(size_t)(capacity - needs[i])]++] = i;
    } else {
        for (i64 i = 0; i < n; ++i) order[(size_t)i] = i;
        std::stable_sort(order.begin(), order.end(), [needs](i64 a, i64 b) { return needs[a] > needs[b]; });
    }
    FirstFit packer(capacity, n);
    for (i64 k = 0; k < n; ++k) rows[order[(size_t)k]] = packer.place(needs[order[(size_t)k]]);
    return packer.rows();
}

// ---------------------------------------------------------------- greedy cut
// One pass: extend the open microbatch while (count + 1) x max(longest, next)
// stays within the budget and count stays below the cap.
// Returns -1 when more than room microbatches would be needed.
i64 greedy_cut(const uint32_t* lengths, i64 m, i64 budget, i64 cap, i64* starts, uint32_t* longest, i64 room) {
    i64 batches = 0, position = 0;
    while (position < m) {
        if (batches == room) return -1;
        uint32_t top = lengths[position];
        i64 count = 1;
        while (position + count < m && count < cap) {
            const uint32_t next = std::max(top, lengths[position + count]);
            if ((count + 1) * (i64)next > budget) break;
            top = next;
            ++count;
        }
        starts[batches] = position;
        longest[batches] = top;
        ++batches;
        position += count;
    }
    return batches;
}

// ---------------------------------------------------------------- Python

struct Buffer {
    Py_buffer view;
    bool held = false;
    ~Buffer() {
        if (held) PyBuffer_Release(&view);
    }
};

// Whether `view` is one-dimensional with items of `itemsize` bytes whose
// format character (byte-order prefix aside) is one of `codes`.
bool is_1d(const Py_buffer& view, Py_ssize_t itemsize, const char* codes) {
    const char* f = view.format ? view.format : "B";
    if (*f == '@' || *f == '=' || *f == '<') ++f;
    return view.ndim <= 1 && view.itemsize == itemsize && f[0] != '\0' && f[1] == '\0' &&
           std::strchr(codes, f[0]) != nullptr;
}

// Acquire `obj` as a contiguous 1-D array of `type` (items of `itemsize`
// bytes, format one of `codes`); TypeError naming `what` otherwise.
bool get_typed(PyObject* obj, Buffer& buf, bool writable, const char* what, Py_ssize_t itemsize, const char* codes,
               const char* type) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &buf.view, flags) != 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s must be a %scontiguous %s array", what, writable ? "writable " : "", type);
        return false;
    }
    buf.held = true;
    if (!is_1d(buf.view, itemsize, codes)) {
        PyErr_Format(PyExc_TypeError, "%s must be a 1-D %s array", what, type);
        return false;
    }
    return true;
}

bool get_array(PyObject* obj, Buffer& buf, bool writable, const char* what, char code, const char* type) {
    const char codes[2] = {code, '\0'};
    return get_typed(obj, buf, writable, what, 4, codes, type);
}

bool get_int64(PyObject* obj, Buffer& buf, bool writable, const char* what) {
    return get_typed(obj, buf, writable, what, 8, "ql", "int64");
}

PyObject* py_pack(PyObject*, PyObject* args) {
    PyObject *needs_obj, *rows_obj;
    long long capacity;
    int mode;
    if (!PyArg_ParseTuple(args, "OLiO:pack", &needs_obj, &capacity, &mode, &rows_obj)) return nullptr;
    Buffer needs_buf, rows_buf;
    if (!get_int64(needs_obj, needs_buf, false, "needs") || !get_int64(rows_obj, rows_buf, true, "rows")) {
        return nullptr;
    }
    const i64 n = (i64)(needs_buf.view.len / 8);
    if ((i64)(rows_buf.view.len / 8) != n) {
        PyErr_SetString(PyExc_ValueError, "rows must be as long as needs");
        return nullptr;
    }
    if (mode < 0 || mode > 2) {
        PyErr_Format(PyExc_ValueError, "mode must be 0 (first-fit), 1 (best-fit) or 2 (greedy), got %d", mode);
        return nullptr;
    }
    if (capacity < 1 || capacity > ((i64)1 << 40)) {
        PyErr_SetString(PyExc_ValueError, "capacity must lie in [1, 2^40]");
        return nullptr;
    }
    const i64* needs = static_cast<const i64*>(needs_buf.view.buf);
    for (i64 i = 0; i < n; ++i) {
        if (needs[i] < 0 || needs[i] > capacity) {
            PyErr_Format(PyExc_ValueError, "needs[%lld] = %lld is outside [0, capacity %lld]", i, needs[i], capacity);
            return nullptr;
        }
    }
    i64* rows = static_cast<i64*>(rows_buf.view.buf);
    i64 count = 0;
    bool no_memory = false;
    Py_BEGIN_ALLOW_THREADS
    try {
        count = mode == 0 ? first_fit(needs, n, capacity, rows)
              : mode == 1 ? best_fit(needs, n, capacity, rows)
                          : greedy(needs, n, capacity, rows);
    } catch (const std::bad_alloc&) {
        no_memory = true;
    }
    Py_END_ALLOW_THREADS
    if (no_memory) return PyErr_NoMemory();
    return PyLong_FromLongLong(count);
}

PyObject* py_cut(PyObject*, PyObject* args) {
    PyObject *lengths_obj, *starts_obj, *longest_obj;
    long long budget, cap;
    if (!PyArg_ParseTuple(args, "OLLOO:cut", &lengths_obj, &budget, &cap, &starts_obj, &longest_obj)) return nullptr;
    Buffer lengths_buf, starts_buf, longest_buf;
    if (!get_array(lengths_obj, lengths_buf, false, "lengths", 'I', "uint32") ||
        !get_int64(starts_obj, starts_buf, true, "starts") ||
        !get_array(longest_obj, longest_buf, true, "longest", 'I', "uint32")) {
        return nullptr;
    }
    const i64 m = (i64)(lengths_buf.view.len / 4);
    const i64 room = (i64)(starts_buf.view.len / 8);
    if ((i64)(longest_buf.view.len / 4) != room) {
        PyErr_SetString(PyExc_ValueError, "starts and longest must be of the same length");
        return nullptr;
    }
    if (budget < 1 || budget > ((i64)1 << 40) || cap < 1) {
        PyErr_SetString(PyExc_ValueError, "budget must lie in [1, 2^40] and cap be at least 1");
        return nullptr;
    }
    const uint32_t* lengths = static_cast<const uint32_t*>(lengths_buf.view.buf);
    i64* starts = static_cast<i64*>(starts_buf.view.buf);
    uint32_t* longest = static_cast<uint32_t*>(longest_buf.view.buf);
    i64 batches = 0;
    Py_BEGIN_ALLOW_THREADS
    batches = greedy_cut(lengths, m, budget, cap, starts, longest, room);
    Py_END_ALLOW_THREADS
    if (batches < 0) {
        PyErr_Format(PyExc_ValueError, "more than %lld microbatches: starts and longest are too short", room);
        return nullptr;
    }
    return PyLong_FromLongLong(batches);
}

// Views of every array of a Python list or tuple (int32, 1-D, contiguous),
// released together. Each view holds its array, so the copies that run
// without the GIL read memory that stays valid whatever happens to the list.
class ListViews {
  public:
    ~ListViews() {
        for (Py_buffer& view : views_) PyBuffer_Release(&view);
    }

    bool get(PyObject* arrays, const char* what) {
        if (!PyList_Check(arrays) && !PyTuple_Check(arrays)) {
            PyErr_Format(PyExc_TypeError, "%s must be a list or tuple of int32 arrays", what);
            return false;
        }
        const Py_ssize_t n = PySequence_Fast_GET_SIZE(arrays);
        try {
            views_.reserve((size_t)n);  // push_back below never reallocates
        } catch (const std::bad_alloc&) {
            PyErr_NoMemory();
            return false;
        }
        for (Py_ssize_t i = 0; i < n; ++i) {
            if (PySequence_Fast_GET_SIZE(arrays) != n) {  // an exporter's Python code changed the list
                PyErr_Format(PyExc_RuntimeError, "%s changed while its buffers were taken", what);
                return false;
            }
            Py_buffer view;
            if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(arrays, i), &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
                PyErr_Clear();
                PyErr_Format(PyExc_TypeError, "%s[%zd] must be a contiguous int32 array", what, i);
                return false;
            }
            views_.push_back(view);
            if (!is_1d(view, 4, "i")) {
                PyErr_Format(PyExc_TypeError, "%s[%zd] must be a 1-D int32 array", what, i);
                return false;
            }
        }
        return true;
    }

    size_t size() const { return views_.size(); }
    const int32_t* data(size_t i) const { return static_cast<const int32_t*>(views_[i].buf); }
    i64 length(size_t i) const { return (i64)(views_[i].len / 4); }

  private:
    std::vector<Py_buffer> views_;
};

struct RowArrays {
    int32_t* input_ids;
    int32_t* loss_mask;
    int32_t* segment_ids;
    int32_t* position_ids;
};

// The inner loop of layout(): one segment's tokens, every output written in
// the same pass (one pass over four streams takes about 30% less time than
// four passes). Every pointer is __restrict: the build uses -fno-strict-aliasing,
// so without it any store could reach any pointer and the loop would not be
// vectorized. Kept out of line: GCC drops __restrict when it inlines it.
#if defined(__GNUC__)
#define UMLOS_NOINLINE __attribute__((noinline))
#else
#define UMLOS_NOINLINE
#endif

UMLOS_NOINLINE i64 lay_out_segment(int32_t* __restrict ids_out, int32_t* __restrict mask_out,
                                   int32_t* __restrict segment_out, int32_t* __restrict position_out,
                                   const int32_t* __restrict ids, const int32_t* __restrict mask, int32_t segment,
                                   i64 n) {
    i64 ones = 0;
    for (i64 i = 0; i < n; ++i) {
        ids_out[i] = ids[i];
        mask_out[i] = mask[i];
        ones += mask[i];
        segment_out[i] = segment;
        position_out[i] = (int32_t)i;
    }
    return ones;
}

// The one pass of layout(): every bound was checked by the caller. A
// separator belongs to the segment before it: same segment id, positions
// going on, mask 0.
i64 lay_out_rows(const ListViews& tokens, const ListViews& masks, const i64* row_first, i64 rows,
                 const int32_t* separator, i64 sep_len, RowArrays out) {
    i64 at = 0, loss = 0;
    for (i64 r = 0; r < rows; ++r) {
        const i64 last = row_first[r + 1] - 1;
        for (i64 k = row_first[r]; k <= last; ++k) {
            const size_t s = (size_t)k;
            const i64 n = tokens.length(s);
            const int32_t segment = (int32_t)(k - row_first[r]);
            loss += lay_out_segment(out.input_ids + at, out.loss_mask + at, out.segment_ids + at,
                                    out.position_ids + at, tokens.data(s), masks.data(s), segment, n);
            at += n;
            if (k < last) {
                for (i64 i = 0; i < sep_len; ++i) {
                    out.input_ids[at + i] = separator[i];
                    out.loss_mask[at + i] = 0;
                    out.segment_ids[at + i] = segment;
                    out.position_ids[at + i] = (int32_t)(n + i);
                }
                at += sep_len;
            }
        }
    }
    return loss;
}

PyObject* py_layout(PyObject*, PyObject* args) {
    PyObject *tokens_obj, *masks_obj, *lengths_obj, *first_obj, *separator_obj;
    PyObject *ids_obj, *mask_obj, *segment_obj, *position_obj;
    if (!PyArg_ParseTuple(args, "OOOOOOOOO:layout", &tokens_obj, &masks_obj, &lengths_obj, &first_obj,
                          &separator_obj, &ids_obj, &mask_obj, &segment_obj, &position_obj)) {
        return nullptr;
    }
    ListViews tokens, masks;
    Buffer lengths_buf, first_buf, separator_buf, ids_buf, mask_buf, segment_buf, position_buf;
    if (!tokens.get(tokens_obj, "tokens") || !masks.get(masks_obj, "masks") ||
        !get_int64(lengths_obj, lengths_buf, false, "lengths") || !get_int64(first_obj, first_buf, false, "row_first") ||
        !get_array(separator_obj, separator_buf, false, "separator", 'i', "int32") ||
        !get_array(ids_obj, ids_buf, true, "input_ids", 'i', "int32") ||
        !get_array(mask_obj, mask_buf, true, "loss_mask", 'i', "int32") ||
        !get_array(segment_obj, segment_buf, true, "segment_ids", 'i', "int32") ||
        !get_array(position_obj, position_buf, true, "position_ids", 'i', "int32")) {
        return nullptr;
    }
    const size_t segments = tokens.size();
    const i64* lengths = static_cast<const i64*>(lengths_buf.view.buf);
    const i64* row_first = static_cast<const i64*>(first_buf.view.buf);
    const i64 rows = (i64)(first_buf.view.len / 8) - 1;
    const i64 sep_len = (i64)(separator_buf.view.len / 4);
    if (masks.size() != segments || (size_t)(lengths_buf.view.len / 8) != segments) {
        PyErr_SetString(PyExc_ValueError, "tokens, masks and lengths must be of the same length");
        return nullptr;
    }
    if (rows < 0 || (rows == 0 && segments) || (rows > 0 && (row_first[0] != 0 || row_first[rows] != (i64)segments))) {
        PyErr_SetString(PyExc_ValueError, "row_first must run from 0 to the number of segments");
        return nullptr;
    }
    for (size_t s = 0; s < segments; ++s) {
        if (tokens.length(s) != lengths[s] || masks.length(s) != lengths[s]) {
            PyErr_Format(PyExc_ValueError, "segment %zu: lengths says %lld, its arrays hold %lld tokens and %lld mask values",
                         s, lengths[s], tokens.length(s), masks.length(s));
            return nullptr;
        }
    }
    i64 total = 0;
    for (i64 r = 0; r < rows; ++r) {
        if (row_first[r + 1] <= row_first[r]) {
            PyErr_Format(PyExc_ValueError, "row %lld holds no segment (row_first must increase)", r);
            return nullptr;
        }
        total += sep_len * (row_first[r + 1] - row_first[r] - 1);
    }
    for (size_t s = 0; s < segments; ++s) total += lengths[s];
    const i64 out_len = (i64)(ids_buf.view.len / 4);
    if (out_len != total || mask_buf.view.len / 4 != total || segment_buf.view.len / 4 != total ||
        position_buf.view.len / 4 != total) {
        PyErr_Format(PyExc_ValueError, "the outputs must each hold %lld values (the rows' tokens and separators)", total);
        return nullptr;
    }
    RowArrays out{static_cast<int32_t*>(ids_buf.view.buf), static_cast<int32_t*>(mask_buf.view.buf),
                  static_cast<int32_t*>(segment_buf.view.buf), static_cast<int32_t*>(position_buf.view.buf)};
    const int32_t* separator = static_cast<const int32_t*>(separator_buf.view.buf);
    i64 loss = 0;
    Py_BEGIN_ALLOW_THREADS
    loss = lay_out_rows(tokens, masks, row_first, rows, separator, sep_len, out);
    Py_END_ALLOW_THREADS
    return PyLong_FromLongLong(loss);
}

PyMethodDef methods[] = {
    {"pack", py_pack, METH_VARARGS,
     "pack(needs, capacity, mode, rows) -> number of rows: first-fit (0), best-fit (1) or greedy (2) "
     "over int64 needs; rows receives each item's row, numbered in opening order."},
    {"cut", py_cut, METH_VARARGS,
     "cut(lengths, budget, cap, starts, longest) -> number of microbatches: the greedy "
     "count x longest <= budget cut of uint32 lengths (at most cap samples each); starts (int64) and "
     "longest (uint32) receive each microbatch's first position and longest length."},
    {"layout", py_layout, METH_VARARGS,
     "layout(tokens, masks, lengths, row_first, separator, input_ids, loss_mask, segment_ids, position_ids) "
     "-> loss tokens: the packed rows' int32 arrays in one pass (segments in row order, row r holding "
     "[row_first[r], row_first[r + 1]), the separator after all but a row's last)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_packing", "First-fit, best-fit and greedy packing, the planner's greedy cut, and packed-row layout (C++).", -1,
                      methods, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__packing(void) { return PyModule_Create(&module); }
