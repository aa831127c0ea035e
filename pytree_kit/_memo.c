/* _memo.c: what the engine keeps from one call to the next.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares (see _core.h's map).
 *
 * Every table kept across calls is a MemoTable: sets of a few ways, each
 * way an entry that starts with a MemoHead (a key, a tag, and when it was
 * last used), the rest of it the table's own. One rule evicts: a new entry
 * takes an empty way of its set, else the way used least recently. Each
 * table says how to let go of an entry's references (release), which
 * memo_clear calls on every entry: _speedups._memo_clear() empties them all,
 * and the module's state frees them when the module goes.
 *
 * The tables (each described where it is read):
 *   plans       class plans under the class's version tags (_class_plans.c)
 *   dict_orders small dicts' key orders and nodes (_classify.c)
 *   big_orders  large dicts' insertion orders (_classify.c, _unflatten.c)
 *   pairs       the (position, order) pairs of specs (_flatten.c)
 *   templates   dicts to copy for keys met again (_unflatten.c)
 * An entry is written after the last allocation of the call that writes it
 * (an allocation may collect garbage, whose finalizers may flatten and
 * write any entry), and what it held is let go of last.
 * Calls: only the C API.
 */

#include "_core.h"

static int
table_init(MemoTable *t, unsigned int set_bits, unsigned int ways, size_t size,
           void (*release)(MemoHead *))
{
    size_t n = ((size_t)1 << set_bits) * ways;
    t->entries = PyMem_Calloc(n, size);
    if (t->entries == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->size = size;
    t->set_bits = set_bits;
    t->ways = ways;
    t->clock = 0;
    t->release = release;
    return 0;
}

/* Let go of every entry of t, leaving them empty; m, when not NULL, is the
 * memo whose plans table t is (PLANS_LOCK held while an entry is taken out,
 * not while its references go). */
static void
table_clear(MemoTable *t, Memo *m)
{
    if (t->entries == NULL) {
        return;
    }
    size_t n = ((size_t)1 << t->set_bits) * t->ways;
    for (size_t i = 0; i < n; i++) {
        MemoHead *h = (MemoHead *)(t->entries + i * t->size);
        /* emptied before its references go: a finalizer they run may look
         * the table up */
        char copy[MEMO_ENTRY_MAX];
        if (m != NULL) {
            PLANS_LOCK(m);
        }
        int held = h->key != 0;
        if (held) {
            memcpy(copy, h, t->size);
            memset(h, 0, t->size);
        }
        if (m != NULL) {
            PLANS_UNLOCK(m);
        }
        if (held) {
            t->release((MemoHead *)copy);
        }
    }
}

/* The first way of the set of hash h (the top bits of a multiplicative
 * hash: the low bits of addresses are aligned away). */
PK_SHARED_INLINE MemoHead *
memo_set(MemoTable *t, uintptr_t h)
{
    uint64_t x = (uint64_t)h * 0x9E3779B97F4A7C15ULL;
    size_t set = t->set_bits ? (size_t)(x >> (64 - t->set_bits)) : 0;
    return (MemoHead *)(t->entries + set * t->ways * t->size);
}

PK_SHARED_INLINE MemoHead *
memo_way(MemoTable *t, MemoHead *set, unsigned int way)
{
    return (MemoHead *)((char *)set + way * t->size);
}

/* Mark an entry as just used. */
PK_SHARED_INLINE void
memo_touch(MemoTable *t, MemoHead *h)
{
    h->used = ++t->clock;
}

/* The entry of (key, tag) in t, marked used, or NULL. */
PK_SHARED_INLINE void *
memo_find(MemoTable *t, uintptr_t key, unsigned int tag)
{
    MemoHead *set = memo_set(t, key);
    for (unsigned int w = 0; w < t->ways; w++) {
        MemoHead *h = memo_way(t, set, w);
        if (h->key == key && h->tag == tag) {
            memo_touch(t, h);
            return h;
        }
    }
    return NULL;
}

/* The way of set that a new entry takes: an empty one, else the one used
 * least recently (a clock that wraps only makes one choice a poor one). */
PK_SHARED MemoHead *
memo_victim(MemoTable *t, MemoHead *set)
{
    MemoHead *v = set;
    for (unsigned int w = 0; w < t->ways; w++) {
        MemoHead *h = memo_way(t, set, w);
        if (h->key == 0) {
            return h;
        }
        if ((int32_t)(h->used - v->used) < 0) {
            v = h;
        }
    }
    return v;
}

/* The entry to write (key, tag) into: the one key holds already (its tag
 * stale: the class changed, or was freed and its address reused), else
 * memo_victim's. Its head is set; what the rest of it holds, the caller
 * replaces and then lets go of (memo_release). */
PK_SHARED void *
memo_slot(MemoTable *t, uintptr_t key, unsigned int tag)
{
    MemoHead *set = memo_set(t, key), *h = NULL;
    for (unsigned int w = 0; w < t->ways && h == NULL; w++) {
        MemoHead *x = memo_way(t, set, w);
        if (x->key == key) {
            h = x;
        }
    }
    if (h == NULL) {
        h = memo_victim(t, set);
    }
    h->key = key;
    h->tag = tag;
    memo_touch(t, h);
    return h;
}

/* ------------------------------------------------------------------------ */
/* How each table's entries let go of their references */

static void
plan_release(MemoHead *h)
{
    KeptPlan *k = (KeptPlan *)h;
    Py_XDECREF(k->info);
    Py_XDECREF(k->reads_obj);
}

static void
dict_order_release(MemoHead *h)
{
    DictOrder *d = (DictOrder *)h;
    Py_XDECREF(d->keys);
    Py_XDECREF(d->node);
    Py_XDECREF(d->order);
}

static void
big_order_release(MemoHead *h)
{
    BigOrder *b = (BigOrder *)h;
    Py_XDECREF(b->order);
    Py_XDECREF(b->keys);
    Py_XDECREF(b->at);
    Py_XDECREF(b->dict);
}

static void
pair_release(MemoHead *h)
{
    Py_XDECREF(((KeptPair *)h)->pair);
}

static void
kept_release(MemoHead *h)
{
    Kept *k = (Kept *)h;
    Py_XDECREF(k->keys);
    Py_XDECREF(k->order);
    Py_XDECREF(k->dict);
}

PK_SHARED int
memo_init(Memo *m)
{
    memset(m, 0, sizeof(*m));
    if (table_init(&m->plans, PLAN_SET_BITS, PLAN_WAYS, sizeof(KeptPlan), plan_release) < 0 ||
        table_init(&m->dict_orders, DICT_ORDER_SET_BITS, DICT_ORDER_WAYS, sizeof(DictOrder),
                   dict_order_release) < 0 ||
        table_init(&m->big_orders, 0, BIG_ORDER_WAYS, sizeof(BigOrder), big_order_release) < 0 ||
        table_init(&m->pairs, PAIR_SET_BITS, PAIR_WAYS, sizeof(KeptPair), pair_release) < 0 ||
        table_init(&m->templates, KEPT_SET_BITS, KEPT_WAYS, sizeof(Kept), kept_release) < 0) {
        memo_free(m);
        return -1;
    }
    return 0;
}

/* Empties every table (what _speedups._memo_clear() does). */
PK_SHARED void
memo_clear(Memo *m)
{
    table_clear(&m->plans, m);
    table_clear(&m->dict_orders, NULL);
    table_clear(&m->big_orders, NULL);
    table_clear(&m->pairs, NULL);
    table_clear(&m->templates, NULL);
}

/* Frees the tables (the module's state going). */
PK_SHARED void
memo_free(Memo *m)
{
    memo_clear(m);
    MemoTable *all[] = {&m->plans, &m->dict_orders, &m->big_orders, &m->pairs, &m->templates};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        PyMem_Free(all[i]->entries);
        all[i]->entries = NULL;
    }
}
