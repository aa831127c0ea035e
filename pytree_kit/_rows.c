/* packed_sample: one sample of a packed dataset (pytree_kit.torch.PackedList),
 * rebuilt from its typed rows. pytree_kit/_rows.py is the specification (read
 * it first: it says what each buffer and leaf code holds); this file gives the
 * same results and raises the same errors with the same messages.
 *
 * The buffers are read through the buffer protocol, read-only: nothing is
 * written to them (a forked DataLoader worker reading samples does not copy
 * the pages that hold them). Every position is checked against the buffers'
 * lengths before it is read.
 *
 * Calls: pk_unflatten (_speedups.c) with the layout's spec; the caller's make
 * for pickled leaves and tensors.
 */
#include "_for_torch.h"

#include <string.h>

/* the leaf codes of _rows.py (tests/test_packed.py checks them) */
enum { C_INT, C_FLOAT, C_BOOL, C_STR, C_BYTES, C_INTS, C_FLOATS, C_PICKLED, C_TENSOR, C_NDARRAY,
       C_NPSCALAR, C_COUNT };
enum { B_INDEX, B_LAYOUTS, B_PLANS, B_META, B_INTS, B_FLOATS, B_BOOLS, B_TEXT, B_COUNT };
/* the largest column start and row count read (_rows.LIMIT): positions stay
 * far from overflowing a long long */
#define PK_ROWS_LIMIT (1LL << 48)
/* the size of one item of each buffer */
static const Py_ssize_t item_size[B_COUNT] = {8, 8, 8, 8, 8, 8, 1, 1};

typedef struct {
    Py_buffer view[B_COUNT];
    Py_ssize_t len[B_COUNT]; /* in items */
    Py_ssize_t sample;       /* named in errors */
} Bufs;

static PyObject *
corrupt(Py_ssize_t i, const char *fmt, ...)
{
    char what[200];
    va_list va;
    va_start(va, fmt);
    PyOS_vsnprintf(what, sizeof what, fmt, va);
    va_end(va);
    PyErr_Format(PyExc_ValueError, "PackedList: sample %zd cannot be read: %s (the data is corrupt)",
                 i, what);
    return NULL;
}

/* where buffer b's item k is (_rows._at); NULL with ValueError outside it */
static const char *
at(Bufs *bufs, int b, long long k)
{
    if (k < 0 || k >= bufs->len[b]) {
        corrupt(bufs->sample, "position %lld is outside a buffer of %zd", k, bufs->len[b]);
        return NULL;
    }
    return (const char *)bufs->view[b].buf + k * item_size[b];
}

/* buffer b's item k as an int64 (b is an int64 buffer); -1 with an error */
static int
at_q(Bufs *bufs, int b, long long k, long long *out)
{
    const char *p = at(bufs, b, k);
    if (p == NULL) {
        return -1;
    }
    memcpy(out, p, 8);
    return 0;
}

static PyObject *
number_list(Bufs *bufs, int b, long long lo, long long hi)
{
    PyObject *list = PyList_New((Py_ssize_t)(hi - lo));
    if (list == NULL) {
        return NULL;
    }
    const char *data = (const char *)bufs->view[b].buf;
    for (long long k = lo; k < hi; k++) {
        PyObject *v;
        if (b == B_INTS) {
            long long x;
            memcpy(&x, data + k * 8, 8);
            v = PyLong_FromLongLong(x);
        }
        else {
            double x;
            memcpy(&x, data + k * 8, 8);
            v = PyFloat_FromDouble(x);
        }
        if (v == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)(k - lo), v);
    }
    return list;
}

/* The leaf of one plan entry (code, base, stride, a, b) at row; NULL with an error. */
static PyObject *
leaf(Bufs *bufs, long long j, const long long plan[5], long long row, PyObject *make)
{
    long long code = plan[0], base = plan[1], stride = plan[2], a = plan[3], b = plan[4], k, v;
    Py_ssize_t i = bufs->sample;
    if (!(0 <= base && base <= PK_ROWS_LIMIT && 0 <= stride && stride <= PK_ROWS_LIMIT)) {
        return corrupt(i, "leaf %lld is at %lld + row * %lld", j, base, stride);
    }
    k = base + row * stride; /* each below 2**48: no overflow */
    switch (code) {
    case C_INT:
        if (at_q(bufs, B_INTS, k, &v) < 0) {
            return NULL;
        }
        return PyLong_FromLongLong(v);
    case C_FLOAT: {
        double d;
        const char *p = at(bufs, B_FLOATS, k);
        if (p == NULL) {
            return NULL;
        }
        memcpy(&d, p, 8);
        return PyFloat_FromDouble(d);
    }
    case C_BOOL: {
        const char *p = at(bufs, B_BOOLS, k);
        if (p == NULL) {
            return NULL;
        }
        unsigned char c = *(const unsigned char *)p;
        if (c > 1) {
            return corrupt(i, "a bool is stored as %d", (int)c);
        }
        return Py_NewRef(c ? Py_True : Py_False);
    }
    case C_STR:
    case C_BYTES:
    case C_PICKLED:
    case C_INTS:
    case C_FLOATS: {
        long long lo, hi;
        int target = code == C_INTS ? B_INTS : code == C_FLOATS ? B_FLOATS : B_TEXT;
        if (!(0 < a && a <= PK_ROWS_LIMIT)) {
            return corrupt(i, "leaf %lld starts %lld before its end", j, a);
        }
        if (at_q(bufs, B_META, k - a, &lo) < 0 || at_q(bufs, B_META, k, &hi) < 0) {
            return NULL;
        }
        if (!(0 <= lo && lo <= hi && hi <= bufs->len[target])) {
            return corrupt(i, "a span %lld:%lld is outside its buffer of %zd", lo, hi,
                           bufs->len[target]);
        }
        if (code == C_INTS || code == C_FLOATS) {
            return number_list(bufs, target, lo, hi);
        }
        const char *text = (const char *)bufs->view[B_TEXT].buf + lo;
        if (code == C_STR) {
            PyObject *s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)(hi - lo), "surrogatepass");
            if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                return corrupt(i, "a str is not UTF-8");
            }
            return s;
        }
        if (code == C_BYTES) {
            return PyBytes_FromStringAndSize(text, (Py_ssize_t)(hi - lo));
        }
        PyObject *payload = PyBytes_FromStringAndSize(text, (Py_ssize_t)(hi - lo)), *r;
        if (payload == NULL) {
            return NULL;
        }
        r = PyObject_CallFunction(make, "LiiO", code, 0, 0, payload);
        Py_DECREF(payload);
        return r;
    }
    case C_TENSOR:
    case C_NDARRAY:
    case C_NPSCALAR: {
        long long first, n;
        PyObject *shape, *r;
        if (b < 0 || b > 64) {
            return corrupt(i, "a tensor has %lld dimensions", b);
        }
        if (at_q(bufs, B_META, k, &first) < 0) {
            return NULL;
        }
        if ((shape = PyTuple_New((Py_ssize_t)b)) == NULL) {
            return NULL;
        }
        int negative = first < 0;
        for (long long d = 0; d < b; d++) {
            PyObject *o;
            if (at_q(bufs, B_META, k + 1 + d, &n) < 0) {
                Py_DECREF(shape);
                return NULL;
            }
            negative |= n < 0;
            if ((o = PyLong_FromLongLong(n)) == NULL) {
                Py_DECREF(shape);
                return NULL;
            }
            PyTuple_SET_ITEM(shape, (Py_ssize_t)d, o);
        }
        if (negative) {
            PyObject *text = PyObject_Repr(shape);
            Py_DECREF(shape);
            if (text == NULL) {
                return NULL;
            }
            PyErr_Format(PyExc_ValueError,
                         "PackedList: sample %zd cannot be read: a tensor starts at %lld with shape "
                         "%U (the data is corrupt)",
                         i, first, text);
            Py_DECREF(text);
            return NULL;
        }
        r = PyObject_CallFunction(make, "LLLO", code, a, first, shape);
        Py_DECREF(shape);
        return r;
    }
    default:
        return corrupt(i, "unknown leaf code %lld", code);
    }
}

/* ------------------------------------------------------------------------ */
/* Packing: number_list and leaf_codes (_rows.py) */

/* x an exact non-empty list of ints only or of floats only: C_INTS or
 * C_FLOATS; else 0; -1 on error. Where the GIL can be off another thread
 * may change the list while it is read: a snapshot of it is read there,
 * taken under its lock. */
static int
number_list_code(PyObject *x)
{
    if (!PyList_CheckExact(x)) {
        return 0;
    }
#ifdef Py_GIL_DISABLED
    PyObject *held = PyList_AsTuple(x);
    if (held == NULL) {
        return -1;
    }
    PyObject *const *items = ((PyTupleObject *)held)->ob_item;
    Py_ssize_t n = PyTuple_GET_SIZE(held);
#else
    PyObject *const *items = ((PyListObject *)x)->ob_item;
    Py_ssize_t n = PyList_GET_SIZE(x);
#endif
    PyTypeObject *t = n ? Py_TYPE(items[0]) : NULL;
    int code = t == &PyLong_Type ? C_INTS : t == &PyFloat_Type ? C_FLOATS : 0;
    for (Py_ssize_t k = 1; code && k < n; k++) {
        if (Py_TYPE(items[k]) != t) {
            code = 0;
        }
    }
#ifdef Py_GIL_DISABLED
    Py_DECREF(held);
#endif
    return code;
}

/* number_list(x) -> bool */
PyObject *
pk_number_list(PyObject *self, PyObject *x)
{
    int code = number_list_code(x);
    return code < 0 ? NULL : Py_NewRef(code ? Py_True : Py_False);
}

static PyObject *code_obj[C_COUNT];

/* leaf_codes(leaves) -> a tuple of codes, None for a leaf of another kind */
PyObject *
pk_leaf_codes(PyObject *self, PyObject *leaves)
{
#ifdef Py_GIL_DISABLED
    /* (a snapshot, taken under the list's lock: see number_list_code) */
    PyObject *seq = PyList_CheckExact(leaves) ? PyList_AsTuple(leaves)
                                              : PySequence_Fast(leaves, "leaf_codes expects a list");
#else
    PyObject *seq = PySequence_Fast(leaves, "leaf_codes expects a list");
#endif
    PyObject *out;
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if ((out = PyTuple_New(n)) == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *x = PySequence_Fast_GET_ITEM(seq, k), *code;
        PyTypeObject *t = Py_TYPE(x);
        if (t == &PyLong_Type) {
            code = code_obj[C_INT];
        }
        else if (t == &PyFloat_Type) {
            code = code_obj[C_FLOAT];
        }
        else if (t == &PyBool_Type) {
            code = code_obj[C_BOOL];
        }
        else if (t == &PyUnicode_Type) {
            code = code_obj[C_STR];
        }
        else if (t == &PyBytes_Type) {
            code = code_obj[C_BYTES];
        }
        else {
            int c = number_list_code(x);
            if (c < 0) {
                Py_DECREF(out);
                Py_DECREF(seq);
                return NULL;
            }
            code = c ? code_obj[c] : Py_None;
        }
        PyTuple_SET_ITEM(out, k, Py_NewRef(code));
    }
    Py_DECREF(seq);
    return out;
}

/* the code objects of leaf_codes; -1 with an error set */
int
pk_rows_init(void)
{
    for (int k = 0; k < C_COUNT; k++) {
        if ((code_obj[k] = PyLong_FromLong(k)) == NULL) {
            return -1;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* packed_sample(bufs, specs, i, make) -> the sample (_rows.packed_sample) */
PyObject *
pk_packed_sample(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Bufs bufs;
    int got = 0;
    PyObject *leaves = NULL, *result = NULL;
    long long layout, row, start, count, rows;
    Py_ssize_t i;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "packed_sample expected 4 arguments, got %zd", nargs);
        return NULL;
    }
    if (!PyTuple_CheckExact(args[0]) || PyTuple_GET_SIZE(args[0]) != B_COUNT) {
        PyErr_SetString(PyExc_TypeError, "packed_sample: bufs must be a tuple of 8 buffers");
        return NULL;
    }
    i = PyLong_AsSsize_t(args[2]);
    if (i == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_IndexError, "PackedList: sample %R is out of range", args[2]);
        }
        return NULL;
    }
    for (; got < B_COUNT; got++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(args[0], got), &bufs.view[got], PyBUF_SIMPLE) < 0) {
            goto done;
        }
        bufs.len[got] = bufs.view[got].len / item_size[got];
    }
    bufs.sample = i;
    if (i < 0 || i >= bufs.len[B_INDEX] / 2) {
        PyErr_Format(PyExc_IndexError, "PackedList: sample %zd is out of range", i);
        goto done;
    }
    if (at_q(&bufs, B_INDEX, 2 * (long long)i, &layout) < 0 ||
        at_q(&bufs, B_INDEX, 2 * (long long)i + 1, &row) < 0) {
        goto done;
    }
    Py_ssize_t nspecs = PyObject_Length(args[1]);
    if (nspecs < 0) {
        goto done;
    }
    if (!(0 <= layout && layout < bufs.len[B_LAYOUTS] / 3) || layout >= nspecs) {
        corrupt(i, "layout %lld does not exist", layout);
        goto done;
    }
    if (at_q(&bufs, B_LAYOUTS, 3 * layout, &start) < 0 ||
        at_q(&bufs, B_LAYOUTS, 3 * layout + 1, &count) < 0 ||
        at_q(&bufs, B_LAYOUTS, 3 * layout + 2, &rows) < 0) {
        goto done;
    }
    if (!(0 <= row && row < rows)) {
        corrupt(i, "row %lld of layout %lld does not exist", row, layout);
        goto done;
    }
    if (start < 0 || count < 0 || rows > PK_ROWS_LIMIT || start > bufs.len[B_PLANS] ||
        count > bufs.len[B_PLANS] || (start + count) * 5 > bufs.len[B_PLANS]) {
        corrupt(i, "the plan of layout %lld is out of bounds", layout);
        goto done;
    }
    if ((leaves = PyList_New((Py_ssize_t)count)) == NULL) {
        goto done;
    }
    for (long long j = 0; j < count; j++) {
        long long plan[5];
        memcpy(plan, (const char *)bufs.view[B_PLANS].buf + (start + j) * 40, 40);
        PyObject *x = leaf(&bufs, j, plan, row, args[3]);
        if (x == NULL) {
            goto done;
        }
        PyList_SET_ITEM(leaves, (Py_ssize_t)j, x);
    }
    {
        PyObject *spec = PySequence_GetItem(args[1], (Py_ssize_t)layout);
        if (spec == NULL) {
            goto done;
        }
        result = pk_unflatten(pk_state(self), spec, leaves);
        Py_DECREF(spec);
    }
done:
    Py_XDECREF(leaves);
    for (int k = 0; k < got; k++) {
        PyBuffer_Release(&bufs.view[k]);
    }
    return result;
}
