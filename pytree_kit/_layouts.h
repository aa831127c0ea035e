/* _layouts.h: CPython's own layouts, as the fast paths read them: the types
 * and macros of the fast paths (each gated by version, _core.h), for the
 * parts that read what the fast paths found (_classify.c's records). The reads
 * themselves, and their import-time checks, are each path's own file's
 * (_fast_*.c).
 */
#ifndef PYTREE_KIT_LAYOUTS_H
#define PYTREE_KIT_LAYOUTS_H

/* (the tables' layout serves the split reads too: each may be left out alone) */
#if DICT_READS || SPLIT_READS || DICT_TABLES
#if PY_VERSION_HEX >= 0x030B0000
/* A dict's table as CPython 3.11, 3.12 and 3.13 lay it out in GIL builds
 * (Include/internal/pycore_dict.h, the same fields in all three; 3.13 adds a
 * mutex where the GIL is disabled, for shared keys only, in what is padding
 * in GIL builds: read on 3.13t by dict_tables alone): ma_keys is this struct, with
 * dk_nentries entries after 1 << dk_log2_index_bytes bytes of indices,
 * (key, value) when its keys are all str (dk_kind 1), else (hash, key,
 * value) (dk_kind 0); a split table (dk_kind 2) has its values apart, in
 * ma_values. On 3.11 a class's shared keys are the same struct. The module
 * checks the reads on import (dict_reads_check) and leaves them off if the
 * check fails. */
typedef struct {
    Py_ssize_t dk_refcnt;
    uint8_t dk_log2_size;
    uint8_t dk_log2_index_bytes;
    uint8_t dk_kind;
#ifdef Py_GIL_DISABLED
    uint8_t dk_mutex; /* (a PyMutex: one byte, unlocked at 0) */
#endif
    uint32_t dk_version;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries;
    char dk_indices[];
} DictKeys;
#define DICT_INDEX_BYTES(k) ((size_t)1 << (k)->dk_log2_index_bytes)
#define DICT_SLOTS(k) ((size_t)1 << (k)->dk_log2_size)
#define DICT_COMBINED(k) ((k)->dk_kind <= 1)
#define DICT_STEP(k) ((k)->dk_kind == 1 ? 2 : 3)
#else
/* A dict's table as CPython 3.10 lays it out (Objects/dict-common.h):
 * ma_keys is this struct, with dk_nentries (hash, key, value) entries after
 * dk_size indices of 1, 2, 4 or 8 bytes each (by dk_size); a split table has
 * its values apart, in ma_values, and so does an empty dict (a shared empty
 * array). Checked on import the same way. */
typedef struct {
    Py_ssize_t dk_refcnt;
    Py_ssize_t dk_size;
    void *dk_lookup;
    Py_ssize_t dk_usable;
    Py_ssize_t dk_nentries;
    char dk_indices[];
} DictKeys;
#define DICT_INDEX_BYTES(k)                                                                \
    ((size_t)(k)->dk_size * ((k)->dk_size <= 0xff ? 1 : (k)->dk_size <= 0xffff ? 2        \
                             : (k)->dk_size <= 0xffffffff ? 4 : 8))
#define DICT_SLOTS(k) ((size_t)(k)->dk_size)
#define DICT_COMBINED(k) 1
#define DICT_STEP(k) 3
#endif

typedef struct {
    PyObject *me_key, *me_value;
} UnicodeEntry; /* entries of str-keyed tables */
typedef struct {
    Py_hash_t me_hash;
    PyObject *me_key, *me_value;
} DictEntry; /* entries of other tables */
#define DICT_ENTRIES(k) ((void *)((k)->dk_indices + DICT_INDEX_BYTES(k)))

/* Split tables of up to this many items are read by dict_table into
 * split_items, as (key, value) pairs. Scratch space, not kept: each caller
 * reads what dict_table gives before anything else runs (no user code, no
 * other dict_table), and only with the GIL held (DICT_READS). */
#define SPLIT_READ_MAX 32
/* pointers from one item to the next there: as in the version's combined
 * tables of str keys, so that a caller's step stays the one it knows (3.10:
 * (hash, key, value), the hash left unset) */
#define SPLIT_STEP (PY_VERSION_HEX >= 0x030B0000 ? 2 : 3)
#endif

#if SPLIT_READS
/* CPython's split dicts (Include/internal/pycore_dict.h; 3.10:
 * Objects/dictobject.c): the __dict__ of an instance of a heap class may share
 * the class's keys (ht_cached_keys, a DictKeys of (key, value) entries, 3.10's
 * of (hash, key, value)) and keep its own values apart, in ma_values: an array
 * of them in the shared keys' order, at the start of ma_values on 3.10 to
 * 3.12, after four bytes (capacity, size, embedded, valid) on 3.13; NULL where
 * the instance has no value for that key. (From 3.11 an instance keeps its
 * values inline until its __dict__ is asked for: that dict is a split one
 * over the same array.) On 3.10 the class may let go of its shared
 * keys, and they may be freed and their memory reused, without a new version
 * tag: split_key_is reads the dict's own table, which is alive. The module
 * checks this on import (split_reads_check) and leaves the path off if it
 * fails. */
typedef struct {
#if PY_VERSION_HEX >= 0x030D0000
    uint8_t capacity, size, embedded, valid;
#endif
    PyObject *values[1];
} SplitValues;
#endif

#if SPLIT_READS
#define SHARED_KEYS(t) ((DictKeys *)((PyHeapTypeObject *)(t))->ht_cached_keys)
/* The key of entry i of a class's shared keys k */
#if PY_VERSION_HEX >= 0x030B0000
#define SHARED_KEY(k, i) (((UnicodeEntry *)DICT_ENTRIES(k))[i].me_key)
#else
#define SHARED_KEY(k, i) (((DictEntry *)DICT_ENTRIES(k))[i].me_key)
#endif
#endif

#endif
