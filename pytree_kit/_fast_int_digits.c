/* _fast_int_digits.c: the fast path int_digits, a one-digit int's value
 * read from ob_digit on 3.10 and 3.11 (3.12 on has the public
 * PyUnstable_Long_CompactValue, which small_long calls there).
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares. Gate: INT_DIGITS (_core.h: 3.10, 3.11, GIL
 * builds). Checked on import by int_digits_check, which sets int_digits_ok;
 * off, small_long calls PyLong_AsSsize_t. What it buys over the portable core
 * (benchmarks/fast_paths.py): FIGURE_int_digits.
 *   small_long        a small non-negative int's value (every version)
 *   int_digits_check  the import-time check
 * Callers: _specread.c, _unflatten.c, _flatten.c (a spec's order pairs).
 * Calls: only the C API.
 */

#include "_core.h"

/* set on import by int_digits_check, where compiled */
PK_DATA int int_digits_ok;

/* The value of an exact int known to be small and non-negative, read
 * without a call when the representation allows; -1 (maybe with an error
 * set) otherwise. */
PK_SHARED_INLINE Py_ssize_t
small_long(PyObject *o)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        return (Py_ssize_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
    }
#elif INT_DIGITS
    /* up to 3.11: the sign and number of digits in ob_size, then the digits */
    if (int_digits_ok) {
        Py_ssize_t size = Py_SIZE(o);
        if (size == 0) {
            return 0;
        }
        if (size == 1) {
            return (Py_ssize_t)((PyLongObject *)o)->ob_digit[0];
        }
    }
#endif
    return PyLong_AsSsize_t(o);
}

#if INT_DIGITS
/* Sets int_digits_ok when small_long's reads of ob_size and ob_digit give
 * what PyLong_AsSsize_t gives, for ints of one digit and of several. */
PK_SHARED void
int_digits_check(void)
{
    static const long long probes[] = {
        0, 1, 7, 255, 32767, 32768, (1LL << 30) - 1, 1LL << 30, 1LL << 31, 1LL << 62,
    };
    int ok = 1;
    int_digits_ok = 1;
    for (size_t i = 0; ok && i < sizeof(probes) / sizeof(probes[0]); i++) {
        PyObject *o = PyLong_FromLongLong(probes[i]);
        if (o == NULL) {
            ok = 0;
            break;
        }
        Py_ssize_t size = Py_SIZE(o);
        /* zero has no digits; a digit holds at most 30 bits */
        ok = (probes[i] == 0) == (size == 0) && (probes[i] < (1LL << 30) || size > 1) &&
             small_long(o) == (Py_ssize_t)probes[i];
        Py_DECREF(o);
    }
    PyErr_Clear();
    int_digits_ok = ok;
}
#endif
