/* pytree_kit._speedups: what its C files share (not a public interface).
 *
 * _speedups.c is the engine; _fastcall.c is the FastCall type, which calls
 * the engine's entry points below directly for the public API's common calls;
 * _reach.c is the search for objects that may reach an instance of a class.
 */
#ifndef PYTREE_KIT_SPEEDUPS_H
#define PYTREE_KIT_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(__GNUC__)
#define PK_INTERNAL __attribute__((visibility("hidden")))
#else
#define PK_INTERNAL
#endif

/* Inline a function into each caller, whatever the compiler's own estimate. */
#if defined(__GNUC__) || defined(__clang__)
#define PK_ALWAYS_INLINE inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#define PK_ALWAYS_INLINE __forceinline
#else
#define PK_ALWAYS_INLINE inline
#endif

/* Keep a function out of line (CPython's Py_NO_INLINE exists from 3.11 on). */
#if defined(__GNUC__) || defined(__clang__)
#define PK_NO_INLINE __attribute__((noinline))
#elif defined(_MSC_VER)
#define PK_NO_INLINE __declspec(noinline)
#else
#define PK_NO_INLINE
#endif

/* The engine's walk: mode 0 leaves(), 1 flatten(), 2 flatten_with_path(). */
PK_INTERNAL PyObject *pk_walk(PyObject *tree, PyObject *is_leaf, PyObject *rules, int mode);
/* unflatten(spec, leaves) */
PK_INTERNAL PyObject *pk_unflatten(PyObject *spec, PyObject *leaves);

/* flatten_up_to(spec, tree), with the default labels of its messages */
PK_INTERNAL PyObject *pk_flatten_up_to(PyObject *spec, PyObject *tree);

/* first_reaching(leaves, start, target, skip, opaque, registered, limit)
 * (_reach.c; the specification is pytree_kit/_reach.py) */
PK_INTERNAL PyObject *pk_first_reaching(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* Adds the FastCall type to the module; -1 with an error set on failure. */
PK_INTERNAL int pk_fastcall_add(PyObject *module);

#endif
