/* _core.h: what the parts of the C engine share. Private to the engine.
 *
 * The engine (pytree_kit._speedups) implements the engine interface of
 * pytree_kit/_pure.py (flatten, leaves, flatten_with_path, iter_leaves,
 * unflatten, flatten_up_to) and must give exactly what the pure engine gives:
 * the same leaves, the same spec nodes and the same errors.
 *
 * How it stays exact:
 *  - The common kinds (tuple, list, dict, None, namedtuple, dataclass, attrs,
 *    __tree_flatten__ and rules) are handled in C, in the same order of checks
 *    and with the same calls into user code as _pure.classify.
 *  - Everything rare (OrderedDict, defaultdict, deque, structseq, metaclasses
 *    with their own attribute lookup, static fields, ...) is handed to the
 *    pure engine's own functions, with the traversal stack rebuilt in the pure
 *    engine's format so that paths in messages come out the same.
 *  - Every error message is made by the pure engine's functions.
 * Traversals use explicit stacks on the heap: no C recursion on user data.
 * Between calls it keeps constants, and, in the module's state (PkState,
 * multi-phase init), the tables of _memo.c: the class plans (_class_plans.c),
 * checked against CPython's type version tags so that they are never stale;
 * and, in bounded tables that hold no user object, what trees met again
 * reuse: small dicts' key orders and nodes, large dicts' orders, the spec's
 * order pairs and dict templates; with tuple and list nodes and emptied
 * tuples for frames' children (_stack.c's spares).
 *
 * The engine's parts each compile on their own against this header, which
 * declares everything one part uses of another (the section "What the parts
 * share" at its end); nothing else of a part is seen outside it, and no part
 * depends on the order of the others. _one_unit.c #includes them all as one
 * compilation unit, so that the compiler inlines across them: setup.py's
 * default build (tests/test_c_layout.py compiles each part alone too).
 *   _core.h       this file: the fast-path gates, the walk modes, the module's
 *                 constants, spec and node makers, growable arrays (Vec), the
 *                 dict keys that run no user code (key_plain), and the types
 *                 of the traversal stack, the per-call type cache and
 *                 classification; what the parts share
 *   _core.c       the module's constants and the helpers declared here
 *   _layouts.h    CPython's own layouts as the fast paths read them (types,
 *                 macros)
 * Each fast path that reads CPython's own layouts, in a file of its own with
 * its gate (below), its import-time check and what it buys:
 *   _fast_type_version_tags.c  a class's version tag (public from 3.12; read
 *                 on 3.10 and 3.11), the key of the class memo
 *   _fast_odict_links.c  an OrderedDict's own order, from its list of keys
 *   _fast_dict_reads.c  an exact dict's entries read in place
 *   _fast_dict_tables.c  unflatten's dicts copied from a template's table
 *   _fast_split_values.c  a record's fields read from its __dict__'s split
 *                 values, at their indexes in the class's shared keys
 * (Three paths measured under the 10 % are gone: int_digits, a small int's
 * digit on 3.10-3.11, 1.08x at most; instance_values, 3.11's inline values,
 * 1.07x; split_tables, a recipe's dicts sharing one split keys table on
 * 3.10-3.12, 1.07x: benchmarks/results/python3.11/fast_paths.md.)
 *   _memo.c       the tables kept across calls: one eviction rule, a clear
 *   _class_plans.c how a class's instances are read, asked of
 *                 _pure.class_plan once per class; the per-call type cache
 *   _stack.c      the traversal stack, its view for the pure engine's error
 *                 messages, and path keys
 *   _classify.c   what a value is, a leaf or a node with children, as
 *                 _pure.classify says
 *   _mapping_kind.c  the mapping kind of dict and UserDict subclasses (a
 *                 tokenizer's BatchEncoding): an instance read and rebuilt
 *   _flatten.c    flatten, leaves, flatten_with_path, and iter_leaves's iterator
 *   _specread.c   reading a TreeSpec: its slots, a node's kind and arity
 *   _unflatten.c  unflatten
 *   _up_to.c      flatten_up_to and flatten_up_to_columns
 *   _speedups.c   the module: its functions, its constants and its init
 * Compiled separately, and reached through _speedups.h: _fastcall.c (FastCall),
 * _specops.c (spec algebra, keystr); and through an interface of their own,
 * _for_torch.h, the torch adapters' helpers: _reach.c, _rows.c.
 */
#ifndef PYTREE_KIT_CORE_H
#define PYTREE_KIT_CORE_H

#include "_speedups.h"
#include <structmember.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Fast paths that read CPython's own layouts
 *
 * The engine's core reads through CPython's public API. Each fast path that
 * reads CPython's own layouts is an add-on, kept only where it buys at least
 * 10 % on some family of the corpus over the core (benchmarks/fast_paths.py;
 * its figures per Python in benchmarks/results/python3.X/fast_paths.md),
 * compiled only for the CPython versions on which its layout was read from
 * that version's own headers or sources and checked (the gates below, GIL
 * builds only), and checked again when the module is imported; a check that
 * fails leaves its path off, and the engine reads through the public API
 * instead, more slowly, with the same results. Building with
 * PYTREE_KIT_NO_FAST_PATHS=1 (which defines PK_NO_FAST_PATHS) leaves every
 * one out, so that the suite can show the fallbacks are right. They are
 * listed, on or off, in FAST_PATHS (pytree_kit.engine_info()):
 *   type_version_tags  a class's plan is kept across calls while its
 *                      tp_version_tag holds, the tag read where CPython has no
 *                      public way to it (3.10, 3.11; VERSION_TAGS; from 3.12
 *                      the engine asks PyUnstable_Type_AssignVersionTag:
 *                      _class_plans.c)
 *   dict_reads         an exact dict's entries read from its table in
 *                      place (3.10-3.15; DICT_READS, dict_reads_check)
 *   dict_tables        dicts of the same keys copied from a template's
 *                      table (3.10-3.15 and 3.13t; DICT_TABLES,
 *                      dict_layout_check)
 *   split_values       a record's field read from its __dict__'s split
 *                      values, at the name's index in the class's shared
 *                      keys (3.10-3.15; SPLIT_READS, split_reads_check)
 *   odict_links        an OrderedDict's own order read from its linked list
 *                      of keys (3.10-3.15; ODICT_LINKS, odict_links_check)
 * 3.14 and 3.15 lay out dicts, their keys tables and split values as 3.13
 * does (Include/internal/pycore_dict.h and Include/cpython/dictobject.h of
 * each: the same structs, less 3.13's ma_version_tag, which no path reads),
 * and an OrderedDict's head and links as every version since 3.5 has
 * (Objects/odictobject.c). */
#if !defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030A0000 && PY_VERSION_HEX < 0x03100000
#define PK_VALIDATED_PYTHON 1
#else
#define PK_VALIDATED_PYTHON 0
#endif
#ifdef PK_NO_FAST_PATHS
#define PK_VALIDATED 0
#else
#define PK_VALIDATED PK_VALIDATED_PYTHON
#endif
/* What is kept across calls in the module's state (tuple and list nodes,
 * order pairs, the dict order and template tables, spare tuples) or in a
 * spec (its unflatten recipe) is read and written with no lock: the GIL
 * guards it. Where the GIL can be off (Py_GIL_DISABLED), none of it is kept
 * but class plans, whose table a mutex guards (Memo's plans_lock: held
 * only to look an entry up and take references to what it holds, or to
 * write one, never while code runs), and a spec's recipe, with its own
 * templates: made whole, then published once by a compare-and-swap, and
 * only read after (_unflatten.c's recipe_of). Spare tuples are emptied and filled
 * again, which holds only while a tuple caches nothing of its items (from
 * 3.14 it caches its hash). */
#ifdef Py_GIL_DISABLED
#define KEEP_ACROSS_CALLS 0
#else
#define KEEP_ACROSS_CALLS 1
#endif
/* Where the GIL can be off, another thread may change a caller's list, dict
 * or object while this one reads it, and a borrowed reference read from it
 * may be freed before it is taken. There each container's children are read
 * from a snapshot taken under the container's own lock (PyList_AsTuple,
 * PyDict_Copy, PyDict_Items, PyDict_GetItemRef: each holds the object's
 * critical section while it reads), a state that existed, and a record's
 * slots through PyMember_GetOne (which takes its reference safely):
 * READ_SNAPSHOTS. With the GIL no other thread runs while no code of ours
 * calls out, and the containers are read in place. */
#ifdef Py_GIL_DISABLED
#define READ_SNAPSHOTS 1
#else
#define READ_SNAPSHOTS 0
#endif
/* A process-wide counter kept for tests (plans_made): added to and read
 * atomically where threads run at once (TSAN saw two threads' plans_made++
 * race), plainly with the GIL. */
#if defined(Py_GIL_DISABLED) && (defined(__GNUC__) || defined(__clang__))
#define PK_COUNT(x) ((void)__atomic_fetch_add(&(x), 1, __ATOMIC_RELAXED))
#define PK_COUNT_READ(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#elif defined(Py_GIL_DISABLED)
#error "pytree_kit: a free-threaded build needs GCC's or Clang's __atomic builtins"
#else
#define PK_COUNT(x) ((void)(x)++)
#define PK_COUNT_READ(x) (x)
#endif
/* The leaf node. A spec holds one reference to it for each of its leaves, and
 * without the GIL two threads' references to one shared object are atomic
 * adds to one count (0.60x the calls a second for two threads flattening
 * lists of 64 leaves, against one). So on a free-threaded build each thread's
 * specs hold a copy of it of that thread's own, equal to it, kept in the
 * thread state's dict (thread_leaf_node, _core.c: a thread adds to its own
 * object's count without an atomic), and a node is the leaf node when it is
 * either (IS_LEAF_NODE). With the GIL every spec holds LEAF_NODE itself. */
#ifdef Py_GIL_DISABLED
#define IS_LEAF_NODE(n) ((n) == LEAF_NODE || is_thread_leaf_node(n))
#else
#define IS_LEAF_NODE(n) ((n) == LEAF_NODE)
#endif
/* PYTREE_KIT_WITHOUT=name,... (setup.py) leaves the fast paths named out, one
 * at a time, to measure what each buys (PK_WITHOUT_<NAME>). */
#if defined(PK_WITHOUT_SPARE_TUPLES)
#define SPARE_TUPLES 0
#else
#define SPARE_TUPLES (KEEP_ACROSS_CALLS && PY_VERSION_HEX < 0x030E0000)
#endif
#if defined(PK_WITHOUT_TYPE_VERSION_TAGS)
#define VERSION_TAGS 0
#else
#define VERSION_TAGS (PK_VALIDATED && PY_VERSION_HEX < 0x030C0000)
#endif
#if defined(PK_WITHOUT_ODICT_LINKS)
#define ODICT_LINKS 0
#else
#define ODICT_LINKS PK_VALIDATED
#endif
#if defined(PK_WITHOUT_DICT_READS)
#define DICT_READS 0
#else
#define DICT_READS PK_VALIDATED
#endif
/* dict_tables builds dicts of the engine's own, never a caller's: where the
 * GIL can be off it reads nothing another thread can change (a template is
 * written once, before any thread sees it, and only copied after), so it is
 * kept there, on the one free-threaded Python whose layout was read from its
 * headers and is run here (3.13t: the table of GIL builds, with a mutex for
 * shared keys in what is padding there). It needs no dict_reads there. */
#if defined(PK_WITHOUT_DICT_TABLES)
#define DICT_TABLES 0
#elif defined(Py_GIL_DISABLED) && !defined(PK_NO_FAST_PATHS)
#define DICT_TABLES (PY_VERSION_HEX >= 0x030D0000 && PY_VERSION_HEX < 0x030E0000)
#elif defined(Py_GIL_DISABLED)
#define DICT_TABLES 0
#else
#define DICT_TABLES DICT_READS
#endif
#if defined(PK_WITHOUT_SPLIT_VALUES)
#define SPLIT_READS 0
#else
#define SPLIT_READS PK_VALIDATED
#endif

/* A dict of more than BIG_DICT keys has its insertion order remembered
 * across calls (_classify.c's big_orders); up to BIG_DICT keys, an insertion
 * order is served by a template within one call (_fast_dict_tables.c). */
#define BIG_DICT 32

/* Containers one unflatten call makes, to be tracked by the collector when
 * the call ends: one strong reference each, room for one per node. Used on
 * 3.10 and 3.11 only (DEFER_TRACKING), where an allocation that takes the
 * youngest generation over its threshold collects it at once: every
 * collection during the call walks every tracked container made so far, and
 * moves them to older generations, which are then walked again (on 10,000
 * records, a third of unflatten's instructions). From 3.12 on a collection
 * waits for the interpreter's next check, after the call. An untracked
 * container is only ever taken as reachable, so deferring is safe. */
typedef struct {
    PyObject **items;
    Py_ssize_t n;
} Untracked;
#if defined(PK_WITHOUT_DEFER_TRACKING)
#define DEFER_TRACKING 0
#else
#define DEFER_TRACKING (PY_VERSION_HEX < 0x030C0000)
#endif

/* Whether every dict is tracked by the collector from its making (3.14 on:
 * no dict is left untracked for holding no container) */
#define DICTS_ALWAYS_TRACKED (PY_VERSION_HEX >= 0x030E0000)

static inline void
untracked_add(Untracked *u, PyObject *o)
{
    u->items[u->n++] = Py_NewRef(o);
}

/* ------------------------------------------------------------------------ */
/* Kinds: in _speedups.h, in step with _kinds.py */

/* How the children of a frame are named in paths (as in _pure). */
enum { KM_SEQ = 0, KM_MAP = 1, KM_ATTR = 2 };

/* How a part's shared functions and data are declared (here) and defined
 * (in the part). Built as one unit (PK_ONE_UNIT, _one_unit.c) they are
 * static, with the inlining each asks for, as in a single file; built as
 * separate objects they are hidden symbols of the extension, declared here,
 * defined once in their part. */
#ifdef PK_ONE_UNIT
#define PK_SHARED static
#define PK_SHARED_INLINE static inline
#define PK_SHARED_ALWAYS_INLINE static PK_ALWAYS_INLINE
#define PK_SHARED_DATA static /* a tentative definition; the part's defines it */
#define PK_DATA static
#else
#define PK_SHARED PK_INTERNAL
#define PK_SHARED_INLINE PK_INTERNAL
#define PK_SHARED_ALWAYS_INLINE PK_INTERNAL
#define PK_SHARED_DATA PK_INTERNAL extern
#define PK_DATA
#endif

/* ------------------------------------------------------------------------ */
/* Module constants, set once by the module's init. */

PK_SHARED_DATA PyObject *kind_obj[K_COUNT];
PK_SHARED_DATA PyObject *LEAF_NODE, *NONE_NODE;
PK_SHARED_DATA PyObject *s_thread_leaf; /* the key of this thread's leaf node (FT builds) */
PK_SHARED_DATA PyTypeObject *TreeSpec_type;
PK_SHARED_DATA Py_ssize_t off_nodes, off_orders, off_num_leaves, off_hash, off_paths, off_recipe;
PK_SHARED_DATA PyObject *as_leaf_rule;  /* _kinds.AS_LEAF: Rule.LEAF */
PK_SHARED_DATA PyObject *py_class_plan; /* _pure.class_plan: how a class's instances are read */
PK_SHARED_DATA PyObject *py_refuse_leaves, *py_refuse_trees; /* _pure's: a str, bytes or mapping given */
PK_SHARED_DATA PyObject *py_classify, *py_dict_order_differs, *py_dict_order, *py_custom_result,
    *py_rule_result, *py_cycle_error, *py_match, *py_mismatch, *py_build;
PK_SHARED_DATA PyObject *SequenceKey_t, *DictKey_t, *GetAttrKey_t;
PK_SHARED_DATA PyObject *OrderedDict_t, *defaultdict_t, *deque_t;
PK_SHARED_DATA PyObject *s_tree_flatten, *s_tree_unflatten, *s_new, *s_flatten, *s_len,
    *s_the_spec, *s_the_tree;
/* _kinds.Carried, NOTHING_CARRIED; "__dict__", "data", "dict", "UserDict" */
PK_SHARED_DATA PyObject *Carried_t, *nothing_carried;
PK_SHARED_DATA Py_ssize_t off_carried_order, off_carried_state; /* its slots' offsets */
PK_SHARED_DATA PyObject *s_dunder_dict, *s_data, *s_dict, *s_userdict;
PK_SHARED_DATA PyObject *empty_tuple;

/* ------------------------------------------------------------------------ */
/* Small helpers */

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* An object's address, mixed (Fibonacci hashing): its low bits are aligned
 * away, so tables keyed by address take their slot from the bits the caller
 * picks (the set and the class memo from the low or middle ones, the counts
 * from the top). */
static inline size_t
ptr_hash(const void *p)
{
    return ((size_t)p >> 4) * (size_t)0x9E3779B97F4A7C15ULL;
}

/* A spec's (position, order) pair; steals order, even on error. */
static inline PyObject *
order_pair(Py_ssize_t position, PyObject *order)
{
    PyObject *pair = PyTuple_New(2), *at = PyLong_FromSsize_t(position);
    if (pair == NULL || at == NULL) {
        Py_XDECREF(pair);
        Py_XDECREF(at);
        Py_DECREF(order);
        return NULL;
    }
    PyTuple_SET_ITEM(pair, 0, at);
    PyTuple_SET_ITEM(pair, 1, order);
    return pair;
}

PK_SHARED int raise_returned(PyObject *exc);

PK_SHARED PyObject *make_node(int kind, PyObject *type, Py_ssize_t arity, PyObject *aux);

PK_SHARED PyObject *make_spec(PyObject *nodes, PyObject *orders, Py_ssize_t num_leaves);

typedef struct {
    void *keys;         /* the class's shared keys when the codes were made */
    int has_dict;       /* its instances have a __dict__ */
    Py_ssize_t n;       /* its fields */
    Py_ssize_t n_values; /* of them, those read from split values */
    Py_ssize_t n_slots; /* its classes' slots that are not fields */
    /* n codes; then n dict flags; then the n_slots slots' offsets */
    Py_ssize_t code[1];
} FieldReads;

/* 1 when field i's name is bound by the class to nothing that a lookup puts
 * before the instance's __dict__ (no data descriptor): the __dict__'s value
 * for it is then getattr's */
#define READS_DICT_OK(r, i) ((r)->code[(r)->n + (i)])
/* the offset of slot j of the class's slots that are not fields */
#define READS_SLOT(r, j) ((r)->code[2 * (r)->n + (j)])

/* ------------------------------------------------------------------------ */
/* What is kept across calls (_memo.c): tables of sets of a few ways, each way
 * an entry starting with a MemoHead; one eviction rule for all of them. */

typedef struct {
    uintptr_t key;     /* 0: an empty way */
    unsigned int tag;  /* part of the key (a class's version tag) */
    uint32_t used;     /* the table's clock when last found or written */
} MemoHead;

typedef struct MemoTable {
    char *entries; /* (1 << set_bits) * ways entries of size bytes each */
    size_t size;
    unsigned int set_bits, ways;
    uint32_t clock;
    void (*release)(MemoHead *); /* lets go of an entry's references */
} MemoTable;

/* no entry is larger (table_clear copies one aside) */
#define MEMO_ENTRY_MAX 256

/* The tables' entries. Each is described where it is read. */

/* a class's plan (the plans table, _class_plans.c) */
typedef struct {
    MemoHead head;         /* key: the class's address; tag: its version tag */
    unsigned int meta_tag; /* its metaclass's (1 for type) */
    int plan;
    PyObject *info;      /* strong or NULL */
    PyObject *reads_obj; /* strong or NULL */
} KeptPlan;
#define PLAN_SET_BITS 7
#define PLAN_WAYS 4

/* a small dict's key order (the dict_orders table, _classify.c) */
#define SMALL_DICT 32
typedef struct {
    MemoHead head;   /* key: a hash of the first and last keys' addresses and the count */
    PyObject *keys;  /* strong: the keys in key order, a tuple */
    PyObject *node;  /* strong or NULL: (K_DICT, None, n, keys) once made */
    PyObject *order; /* strong or NULL: the keys in insertion order, once made
                      * (only where it differs from key order) */
    int permuted;    /* the insertion order is not key order */
    uint8_t perm[SMALL_DICT];
} DictOrder;
#define DICT_ORDER_SET_BITS 8
#define DICT_ORDER_WAYS 4

/* a large dict's insertion order (the big_orders table, _classify.c) */
typedef struct {
    MemoHead head;   /* key: the first key's address */
    PyObject *order; /* strong: the keys in insertion order, a tuple */
    PyObject *keys;  /* strong: the same keys in sorted order (the node's), a tuple */
    PyObject *at;    /* strong: bytes, Py_ssize_t at[i]: order[i]'s place in keys */
    PyObject *dict;  /* strong or NULL: the template, {k: None} in insertion order */
} BigOrder;
#define BIG_ORDER_WAYS 4

/* a spec's (position, order) pair (the pairs table, _flatten.c) */
typedef struct {
    MemoHead head; /* key: a hash of the order's address and the position */
    PyObject *pair;
} KeptPair;
/* 64 sets of 4 ways: the pairs of one order at up to 4 positions of a tree
 * are all kept, wherever the hash puts them */
#define PAIR_SET_BITS 6
#define PAIR_WAYS 4

/* a dict template (the templates table, _unflatten.c; dict_tables only) */
typedef struct {
    MemoHead head;   /* key: a hash of the key objects and the order's first */
    PyObject *keys;  /* strong: the node's keys, a tuple */
    PyObject *order; /* strong or NULL: the insertion order, a tuple; NULL: key order */
    PyObject *dict;  /* strong or NULL: the template, made the second time */
    size_t size;     /* of the template's table, in bytes */
    uint16_t unusable; /* keys that no template serves */
    uint16_t tuples;   /* a key is a tuple (template_make) */
    uint8_t at[BIG_DICT]; /* with an order: the place of its i-th key among keys */
} Kept;
#define KEPT_SET_BITS 9
#define KEPT_WAYS 4

typedef struct {
    MemoTable plans, dict_orders, big_orders, pairs, templates;
#ifdef Py_GIL_DISABLED
    PyMutex plans_lock; /* plans, where the GIL can be off (KEEP_ACROSS_CALLS) */
#endif
} Memo;

/* Held around a look-up of the plans table and the taking of references to
 * what its entry holds, or a write of one; never while code may run (a
 * release of references is done after). Nothing where the GIL guards it. */
#ifdef Py_GIL_DISABLED
#define PLANS_LOCK(m) PyMutex_Lock(&(m)->plans_lock)
#define PLANS_UNLOCK(m) PyMutex_Unlock(&(m)->plans_lock)
#else
#define PLANS_LOCK(m) ((void)0)
#define PLANS_UNLOCK(m) ((void)0)
#endif

/* Tuple and list nodes of fewer children than this are made once and kept
 * in the state, shared by every spec (_classify.c's seq_node) */
#define SHARED_SEQ_NODES 16
/* Emptied tuples kept for the next frame of their size (_stack.c's spares,
 * where SPARE_TUPLES): a pool, not keyed */
#define SPARE_MAX 16
#define SPARE_PER_SIZE 16

/* The module's state (multi-phase init): everything kept from one call to
 * the next. */
struct PkState {
    Memo memo;
    /* the nodes of tuples and lists of fewer than 16 children, by arity:
     * made once and kept (they hold only ints and None), shared by every spec */
    PyObject *seq_nodes[2][SHARED_SEQ_NODES];
    PyObject *spare[SPARE_MAX + 1][SPARE_PER_SIZE];
    int spare_n[SPARE_MAX + 1];
};

/* ------------------------------------------------------------------------ */
/* Per-call knowledge of types: each class's plan (_class_plans.c), kept for
 * the whole call, as the pure engine keeps its per-call cache.
 *
 * The plans, in step with _pure.PLAN_* (tests/test_versions.py checks it). */

enum {
    PLAN_LEAF = 0, PLAN_TUPLE_LEAF = 1, PLAN_NAMEDTUPLE = 2, PLAN_DATACLASS = 3, PLAN_ATTRS = 4,
    PLAN_CUSTOM = 5, PLAN_PYTHON = 6, PLAN_MAPPING = 7
};

typedef struct {
    PyTypeObject *type; /* strong */
    int plan;
    PyObject *info; /* strong or NULL: namedtuple _fields; a record's aux when every field
                       is set, (names, (), (), None), or NULL if a field is static;
                       a mapping's class_plan answer, less its code */
    PyObject *node; /* strong or NULL: this call's node for the info above */
    PyObject *reads_obj;     /* strong or NULL: a record's FieldReads, in a bytes object */
    const FieldReads *reads; /* its contents, or NULL */
} TypeEntry;

#define TC_INLINE 8

/* Double the capacity of an array that starts in its inline storage and moves
 * to the heap on its first growth, or raise it to need if that is more. On
 * failure: MemoryError set, -1 returned, the array unchanged. */
PK_SHARED int grow_array(void **v, void *inline_v, Py_ssize_t n, Py_ssize_t *cap, size_t item, Py_ssize_t need);

typedef struct {
    TypeEntry *v; /* NULL until the first entry; then inline or on the heap */
    Py_ssize_t n, cap;
    TypeEntry inline_v[TC_INLINE];
} TypeCache;

/* ------------------------------------------------------------------------ */
/* The traversal stack */

typedef struct {
    PyObject *obj;      /* strong */
    PyObject *children; /* strong: tuple or list */
    PyObject *names;    /* strong or NULL */
    Py_ssize_t pos;     /* the next child; the one being visited is pos - 1 */
    Py_ssize_t n;
    int keymode;
    int live; /* children is the list being flattened itself, not a copy */
} Frame;

#define STACK_INLINE 64

typedef struct {
    Frame *v; /* inline_v or the heap */
    Py_ssize_t n, cap;
    /* pointer set of the frames' objects, used once the stack is deep */
    void **set;
    Py_ssize_t set_cap, set_n;
    /* counts of the frames' objects by a hash of their address: a cheap
     * "certainly not on the stack" once the stack is more than a few deep;
     * counts_mask + 1 of them, more once the stack is deeper; a count that
     * reaches COUNT_STUCK stays there (_stack.c) */
    uint8_t *counts;
    size_t counts_mask;
    Py_ssize_t nlive; /* frames whose children are the caller's list itself */
    PyObject *view; /* strong or NULL: a StackView of this stack */
    PkState *st;    /* the module's state (its spare tuples) */
    Frame inline_v[STACK_INLINE];
} Stack;


typedef struct {
    PyObject_HEAD
    Stack *s; /* NULL once detached */
} StackView;


/* ------------------------------------------------------------------------ */
/* Growable arrays of strong references */

#define VEC_INLINE 128

typedef struct {
    PyObject **v; /* inline_v or the heap */
    Py_ssize_t n, cap;
    PyObject *inline_v[VEC_INLINE];
} Vec;

static inline void
vec_init(Vec *a)
{
    a->v = a->inline_v;
    a->n = 0;
    a->cap = VEC_INLINE;
}

PK_SHARED int vec_grow(Vec *a, Py_ssize_t need);

/* Room for k more items with no further growth. */
static inline int
vec_reserve(Vec *a, Py_ssize_t k)
{
    return a->cap - a->n >= k ? 0 : vec_grow(a, a->n + k);
}

static inline int
vec_push(Vec *a, PyObject *o)
{
    /* steals o */
    if (a->n == a->cap && vec_grow(a, 0) < 0) {
        Py_DECREF(o);
        return -1;
    }
    a->v[a->n++] = o;
    return 0;
}

/* Append new references to src[0 .. k). */
static inline int
vec_extend(Vec *a, PyObject *const *src, Py_ssize_t k)
{
    if (vec_reserve(a, k) < 0) {
        return -1;
    }
    PyObject **dst = a->v + a->n;
    for (Py_ssize_t j = 0; j < k; j++) {
        Py_INCREF(src[j]);
        dst[j] = src[j];
    }
    a->n += k;
    return 0;
}

/* A dict key whose hash and equality run no user code and keep no user
 * object alive: an exact str, int or float, True, False or None, or an exact
 * tuple of those (a label pair, a grid point). Dicts of such keys are made
 * from templates (_fast_dict_tables.c) and in their insertion order at once
 * (_unflatten.c's dict_in_order). */
static inline int
key_atom(PyObject *k)
{
    return PyUnicode_CheckExact(k) || PyLong_CheckExact(k) || PyFloat_CheckExact(k) ||
           PyBool_Check(k) || k == Py_None;
}

static inline int
key_plain(PyObject *k)
{
    if (key_atom(k)) {
        return 1;
    }
    if (!PyTuple_CheckExact(k)) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(k); i++) {
        if (!key_atom(PyTuple_GET_ITEM(k, i))) {
            return 0;
        }
    }
    return 1;
}

/* Before 3.12 a str made by the legacy API may not be ready to read. */
#if PY_VERSION_HEX < 0x030C0000
#define STR_READY(o) PyUnicode_IS_READY(o)
#else
#define STR_READY(o) 1
#endif

/* a < b for two exact str or two exact int keys: never runs user code */
static inline int
key_lt(PyObject *a, PyObject *b, int str)
{
    if (str) {
        if (STR_READY(a) && STR_READY(b) && PyUnicode_KIND(a) == PyUnicode_1BYTE_KIND &&
            PyUnicode_KIND(b) == PyUnicode_1BYTE_KIND) {
            /* code point order is byte order for one-byte strings */
            Py_ssize_t la = PyUnicode_GET_LENGTH(a), lb = PyUnicode_GET_LENGTH(b);
            int r = memcmp(PyUnicode_1BYTE_DATA(a), PyUnicode_1BYTE_DATA(b), la < lb ? la : lb);
            return r < 0 || (r == 0 && la < lb);
        }
        return PyUnicode_Compare(a, b) < 0;
    }
    return PyObject_RichCompareBool(a, b, Py_LT);
}

/* The item array of a tuple or a list. */
static inline PyObject **
seq_items(PyObject *seq)
{
    return PyTuple_Check(seq) ? ((PyTupleObject *)seq)->ob_item : ((PyListObject *)seq)->ob_item;
}

PK_SHARED void vec_clear(Vec *a);

PK_SHARED PyObject *vec_to_tuple(Vec *a);

/* A new tuple (or list) of ch[0 .. n). */
PK_SHARED PyObject *seq_of(int list, PyObject **ch, Py_ssize_t n);

/* Moves the references into a new list: a heap array becomes the list's own
 * storage (lists free theirs with PyMem_Free), trimmed when mostly unused. */
PK_SHARED PyObject *vec_to_list(Vec *a);

/* A list of n items that the caller sets at once, before anything else can
 * see the list or run the GC: PyList_New(n) less its zeroing of the items
 * (PyList_New(0), then items from malloc, as vec_to_list hands a list its
 * array). New reference. */
PK_SHARED PyObject *list_to_fill(Py_ssize_t n);

/* READ_SNAPSHOTS: a private exact dict of d's items (a dict, or a subclass
 * read as its storage, whatever its methods say), taken under d's lock; a
 * new reference. Elsewhere it is not compiled. */
#if READ_SNAPSHOTS
PK_SHARED PyObject *dict_snapshot(PyObject *d);
#endif

/* The object in obj's slot at offset off (a member of Py_T_OBJECT_EX), a new
 * reference, or NULL when the slot is empty, with an error set only on
 * failure. READ_SNAPSHOTS: read by PyMember_GetOne, which takes its
 * reference safely while another thread may set the slot. */
static inline PyObject *
slot_ref(PyObject *obj, Py_ssize_t off)
{
#if READ_SNAPSHOTS
    PyMemberDef m = {"", Py_T_OBJECT_EX, off, 0, NULL};
    PyObject *x = PyMember_GetOne((const char *)obj, &m);
    if (x == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) {
        PyErr_Clear();
    }
    return x;
#else
    return Py_XNewRef(SLOT(obj, off));
#endif
}

/* Append a new reference to x. */
static inline int
emit(Vec *a, PyObject *x)
{
    Py_INCREF(x);
    return vec_push(a, x);
}

/* One leaf, x: into the leaves, and its node (leaf_node: the call's
 * Ctx's) into the nodes when a spec is built. */
static inline int
emit_leaf(Vec *leaves, Vec *nodes, WalkMode mode, PyObject *x, PyObject *leaf_node)
{
    if (emit(leaves, x) < 0) {
        return -1;
    }
    if (mode != WALK_LEAVES) {
        Py_INCREF(leaf_node);
        return vec_push(nodes, leaf_node);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Classification: what _pure.classify returns, or a leaf. */

typedef struct {
    PyObject *node;     /* strong, or NULL when no spec is built */
    PyObject *children; /* strong: tuple or list */
    PyObject *names;    /* strong or NULL */
    int keymode;
    int live;
    int dict_kind; /* DICT or DEFAULTDICT: the insertion order may be recorded */
    Py_ssize_t direct_n; /* > 0: no children to visit; these leaves follow the node */
    PyObject *direct[32]; /* borrowed from the dict (nothing runs before they are taken),
                             or strong when direct_owned (a record's fields) */
    int direct_owned;
    int order_known; /* the dict's order was found already: order, or the same when NULL */
    PyObject *order; /* strong or NULL: the insertion order, when it differs */
    int order_kept;  /* order is the one dict_memo holds (_classify.c) */
} Found;

typedef struct {
    PyObject *is_leaf; /* NULL for None */
    PyObject *rules;   /* exact dict or NULL */
    WalkMode mode;
    const Vec *path_keys; /* WALK_PATHS's keys when is_leaf takes (path, value), else NULL */
    TypeCache types;
    PyObject *pycache; /* the pure engine's per-call cache, made when first needed */
    int atom_leaf[6];
    PyTypeObject *last_leaf; /* the type of the last leaf classified by type */
    int dict_misses;          /* small dicts in a row not found in dict_memo */
    PkState *st;              /* the module's state: what is kept across calls */
    PyObject *leaf_node;      /* strong: the leaf node this call's specs hold (thread_leaf_node) */
} Ctx;

/* _core.c: this thread's leaf node (borrowed; LEAF_NODE with the GIL, or
 * when it cannot be made), and whether node is such a copy */
PK_SHARED PyObject *thread_leaf_node(void);
#ifdef Py_GIL_DISABLED
PK_SHARED int is_thread_leaf_node(PyObject *node);
#endif

/* {keys[i]: vals[i * step]} for i in 0 .. n, inserted in key order: a dict
 * node with no insertion order of its own. step is 1 for children in leaf
 * order, -1 for children read down the value stack. New reference. */
static inline PyObject *
dict_in_key_order(PyObject *keys, PyObject *const *vals, Py_ssize_t n, Py_ssize_t step)
{
    PyObject *m = PyDict_New();
    if (m == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyDict_SetItem(m, PyTuple_GET_ITEM(keys, i), vals[i * step]) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}


/* ------------------------------------------------------------------------ */
/* What the parts share: each part's functions and data that another part
 * (or the module, _speedups.c) uses. Nothing else of a part is seen outside
 * it. */


#include "_layouts.h"

/* The fast paths, a file each (_fast_*.c): each
 * path's flag is set on import by its check (_speedups.c's init calls them) */
PK_SHARED_DATA int dict_reads_ok, dict_layout_ok, split_reads_ok, odict_links_ok;
/* _fast_type_version_tags.c: a class's version tag */
PK_SHARED_INLINE unsigned int class_tag(PyTypeObject *t, int assign);
PK_SHARED_INLINE unsigned int meta_tag(PyTypeObject *t, int assign);
PK_SHARED int plans_kept(void);
PK_SHARED void tags_check(void);
/* _fast_odict_links.c: an OrderedDict's own order */
PK_SHARED int odict_in_dict_order(PyObject *obj);
#if ODICT_LINKS
PK_SHARED void odict_links_check(void);
#endif
/* _fast_dict_reads.c: a dict's entries in place */
#if DICT_READS
PK_SHARED_INLINE int dict_table(PyObject *d, PyObject ***first, Py_ssize_t *step);
PK_SHARED void dict_reads_check(void);
#endif
/* _fast_dict_tables.c: dicts copied from a template's table */
#if DICT_TABLES
PK_SHARED int dict_from_template(PyObject *tmpl, size_t size, int tuples, const Py_ssize_t *at, PyObject *const *vals, Py_ssize_t n, Py_ssize_t step, PyObject **out, Untracked *later);
PK_SHARED void dict_layout_check(void);
PK_SHARED int template_make(PyObject *ins, Py_ssize_t n, PyObject **dict, size_t *size, int *tuples);
PK_SHARED int template_plain(PyObject *t, Py_ssize_t n);
PK_SHARED size_t template_size(PyObject *t);
#endif
/* _fast_split_values.c: a __dict__'s split values */
PK_SHARED void layout_field_codes(PyTypeObject *t, PyObject *names, FieldReads *r);
#if SPLIT_READS
PK_SHARED_INLINE int split_key_is(const FieldReads *r, Py_ssize_t ix, PyObject *name);
PK_SHARED void split_reads_check(void);
PK_SHARED_INLINE PyObject **split_values(PyObject *dict, const FieldReads *r);
#endif

/* _stack.c: the traversal stack, its view for error messages, path keys */
PK_SHARED_DATA PyTypeObject StackView_Type;
PK_SHARED PyObject *children_tuple(PkState *st, PyObject *const *ch, Py_ssize_t n);
PK_SHARED_INLINE PyObject *frame_item(Frame *f, Py_ssize_t i);
PK_SHARED PyObject *frame_key(Frame *f, Py_ssize_t i);
PK_SHARED_INLINE PyObject *frame_next(Frame *fr, Py_ssize_t *at);
PK_SHARED int key_init(void);
PK_SHARED PyObject *spare_tuple(PkState *st, Py_ssize_t n);
PK_SHARED void stack_clear(Stack *s);
PK_SHARED int stack_freeze(Stack *s);
PK_SHARED int stack_holds(Stack *s, PyObject *obj);
PK_SHARED void stack_init(Stack *s, PkState *st);
PK_SHARED int stack_push(Stack *s, PyObject *obj, PyObject *children, PyObject *names, int keymode, int live, int track);
PK_SHARED PyObject *stack_py(Stack *s);
PK_SHARED_INLINE int stack_unread(Stack *s, Frame **out);

/* _memo.c: the tables kept across calls */
PK_SHARED int memo_init(Memo *m);
PK_SHARED void memo_clear(Memo *m);
PK_SHARED void memo_free(Memo *m);
PK_SHARED_INLINE void *memo_find(MemoTable *t, uintptr_t key, unsigned int tag);
PK_SHARED void *memo_slot(MemoTable *t, uintptr_t key, unsigned int tag);
PK_SHARED_INLINE MemoHead *memo_set(MemoTable *t, uintptr_t h);
PK_SHARED_INLINE MemoHead *memo_way(MemoTable *t, MemoHead *set, unsigned int way);
PK_SHARED_INLINE void memo_touch(MemoTable *t, MemoHead *h);
PK_SHARED MemoHead *memo_victim(MemoTable *t, MemoHead *set);

/* _class_plans.c: how a class's instances are read, asked of _pure.class_plan */
/* how many times _pure.class_plan was asked (for tests) */
PK_SHARED_DATA Py_ssize_t plans_made;
PK_SHARED TypeEntry *class_entry(Ctx *c, Stack *s, PyTypeObject *t);
PK_SHARED_INLINE const FieldReads *reads_of(PyObject *reads_obj);
PK_SHARED PyObject *record_reads(PyTypeObject *t, PyObject *names, PyObject *reads, PyObject *other);
PK_SHARED void tc_clear(TypeCache *c);
PK_SHARED TypeEntry *tc_find(TypeCache *c, PyTypeObject *t);

/* _classify.c: what a value is; dict orders */

PK_SHARED int big_dict_values(PkState *st, PyObject *obj, PyObject *keys, PyObject **vals);
PK_SHARED BigOrder *big_order_for(PkState *st, PyObject *obj, PyObject *keys);
PK_SHARED int big_order_note(PkState *st, PyObject *keys, PyObject *order, const Py_ssize_t *at, Py_ssize_t n);
PK_SHARED int classify(Ctx *c, Stack *s, PyObject *obj, Found *f);
PK_SHARED void ctx_clear(Ctx *c);
PK_SHARED int ctx_init(Ctx *c, PkState *st, PyObject *is_leaf, PyObject *rules, WalkMode mode);
PK_SHARED PyObject *dict_order(PyObject *node, PyObject *obj, PyObject *names);
PK_SHARED PyObject *dict_values(PyObject *obj, PyObject **keys, Py_ssize_t n);
PK_SHARED Py_ssize_t field_named(PyObject *names, Py_ssize_t n, PyObject *k);
PK_SHARED int key_places(PyObject *const *keys, PyObject *const *order, Py_ssize_t n, Py_ssize_t *at);
PK_SHARED int keys_sorted(PyObject *keys);
PK_SHARED_INLINE int known_leaf(Ctx *c, PyTypeObject *t);
PK_SHARED int odict_items(PyObject *obj, PyObject **keys_out, PyObject **values_out);
PK_SHARED int record_fields(Ctx *c, Stack *s, PyObject *obj, TypeEntry *e, int kind, Found *f, int want_node);
PK_SHARED_ALWAYS_INLINE int record_read(PyObject *obj, const FieldReads *r, PyObject *names, PyObject **v, Py_ssize_t *absent, Stack *s);
PK_SHARED void release_direct(Found *f);
PK_SHARED_INLINE int same_items(PyObject *a, PyObject *b);
PK_SHARED int user_result(Ctx *c, Stack *s, PyObject *res, PyTypeObject *t, PyObject *helper, PyObject **children, PyObject **tail, PyObject **names, int *keymode);

/* _mapping_kind.c: dict and UserDict subclasses */
PK_SHARED int mapping_classify(Ctx *c, PyObject *obj, TypeEntry *e, Found *f);
PK_SHARED PyObject *mapping_build(PyObject *t, PyObject *aux, PyObject *const *ch, Py_ssize_t arity);

/* _flatten.c: flatten, leaves, flatten_with_path, iter_leaves */
PK_SHARED_DATA PyTypeObject LeafIter_Type;
PK_SHARED PyObject *sp_any_leaf(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PK_SHARED PyObject *sp_flatten(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PK_SHARED PyObject *sp_flatten_one_level(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PK_SHARED PyObject *sp_flatten_with_path(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PK_SHARED PyObject *sp_iter_leaves(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PK_SHARED PyObject *sp_leaves(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* _specread.c: reading a TreeSpec */
PK_SHARED_INLINE Py_ssize_t small_long(PyObject *o);
PK_SHARED_INLINE int node_parts(PyObject *node, int *kind, Py_ssize_t *arity);
PK_NO_INLINE PK_SHARED Py_ssize_t order_index(PyObject *orders, Py_ssize_t i);
PK_SHARED int spec_parts(PyObject *spec, PyObject **nodes, PyObject **orders, Py_ssize_t *num_leaves);

/* _unflatten.c: unflatten */
PK_SHARED_DATA PyTypeObject Recipe_Type;
PK_SHARED PyObject *sp_unflatten(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* _up_to.c: flatten_up_to and flatten_up_to_columns */
PK_SHARED PyObject *sp_flatten_up_to(PyObject *self, PyObject *const *args, Py_ssize_t nargs);
PK_SHARED PyObject *sp_flatten_up_to_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

#endif
