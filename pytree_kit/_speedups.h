/* pytree_kit._speedups: what its separately compiled C files share (not a
 * public interface).
 *
 * _speedups.c is the engine's module; it #includes the engine's parts as one
 * unit (_core.h has their map). Compiled on their own: _fastcall.c is the
 * FastCall type, which calls the engine's entry points below directly for the
 * public API's common calls; _specops.c is the spec algebra (compose,
 * is_prefix, paths) and keystr. The torch adapters' helpers (_reach.c,
 * _rows.c) have an interface of their own: _for_torch.h.
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

/* Kinds of node: keep in step with _kinds.py (tests/test_versions.py checks). */
enum {
    K_LEAF = 0, K_NONE = 1, K_TUPLE = 2, K_LIST = 3, K_DICT = 4, K_ORDEREDDICT = 5,
    K_DEFAULTDICT = 6, K_DEQUE = 7, K_NAMEDTUPLE = 8, K_STRUCTSEQ = 9, K_DATACLASS = 10,
    K_ATTRS = 11, K_CUSTOM = 12, K_RULE = 13, K_MAPPING = 14, K_SEQUENCE = 15, K_COUNT = 16
};

/* kind and arity of a spec node, checked; -1 with ValueError on a malformed one */
PK_INTERNAL int pk_node_parts(PyObject *node, int *kind, Py_ssize_t *arity);

/* A path key (_keys.py): SequenceKey(value), DictKey(value) or GetAttrKey(value). */
enum { PK_KEY_SEQUENCE = 0, PK_KEY_DICT = 1, PK_KEY_ATTR = 2 };
PK_INTERNAL PyObject *pk_key(int which, PyObject *value);
/* the class of each (borrowed) */
PK_INTERNAL PyObject *pk_key_class(int which);
PK_INTERNAL PyObject *pk_key_value(int which, PyObject *k);

/* spec_compose, spec_is_prefix, spec_paths (_specops.c; the specification is
 * _pure.py's functions of those names) */
PK_INTERNAL PyObject *pk_spec_compose(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PK_INTERNAL PyObject *pk_spec_is_prefix(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PK_INTERNAL PyObject *pk_spec_paths(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PK_INTERNAL PyObject *pk_path_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
/* keystr(path): "".join(map(str, path)) (_specops.c) */
PK_INTERNAL PyObject *pk_keystr(PyObject *self, PyObject *path);
/* reads what _specops.c needs from pytree_kit._spec; -1 with an error set */
PK_INTERNAL int pk_specops_init(PyObject *spec_module);

/* What a walk gives (_flatten.c): the leaves (leaves()); and the spec
 * (flatten()); and the paths (flatten_with_path()). Each gives what the one
 * before it gives, and more. */
typedef enum { WALK_LEAVES = 0, WALK_SPEC = 1, WALK_PATHS = 2 } WalkMode;

/* The module's state: what the engine keeps from one call to the next
 * (_core.h). pk_state gives the state of the module _speedups.c made. */
typedef struct PkState PkState;
PK_INTERNAL PkState *pk_state(PyObject *module);

/* The engine's walk, in one of those modes. */
PK_INTERNAL PyObject *pk_walk(PkState *st, PyObject *tree, PyObject *is_leaf, PyObject *rules,
                              WalkMode mode);
/* unflatten(spec, leaves) */
PK_INTERNAL PyObject *pk_unflatten(PkState *st, PyObject *spec, PyObject *leaves);

/* Adds the FastCall type to the module, whose state the FastCalls made from
 * then on read; -1 with an error set on failure. */
PK_INTERNAL int pk_fastcall_add(PyObject *module);
/* The module going: no FastCall made after takes it. */
PK_INTERNAL void pk_fastcall_module_gone(PyObject *module);

#endif
