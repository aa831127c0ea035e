/* _stack.c: the traversal stack, its view, and path keys.
 *
 * One of the engine's parts: compiles on its own against _core.h, which
 * declares what it shares (see _core.h's map).
 *   stack_push/pop     frames of the containers being read (Frame, Stack in
 *                      _core.h), with a pointer set and counts that make
 *                      "is this object on the stack" (cycles) cheap when deep
 *   stack_freeze       copies the lists still being read before user code runs
 *   spare tuples       a popped frame's emptied tuple of children, kept for
 *                      the next frame of that size (children_tuple)
 *   StackView          the stack in the pure engine's frame format, for the
 *                      pure engine's error messages (made only when read)
 *   pk_key, frame_key  path keys (_keys.py) made without calling their class
 * Calls: _core.h only. Called by _classify.c, _flatten.c, _up_to.c, _specops.c.
 */

#include "_core.h"

PK_SHARED void
stack_init(Stack *s, PkState *st)
{
    s->st = st;
    s->v = s->inline_v;
    s->n = 0;
    s->cap = STACK_INLINE;
    s->set = NULL;
    s->set_cap = s->set_n = 0;
    s->counts = NULL;
    s->counts_mask = 0;
    s->nlive = 0;
    s->view = NULL;
}


/* Spare tuples
 *
 * A dict or record whose children are not all leaves gives its frame a new
 * tuple of them, which lives until the frame is popped: a chain of ten dicts
 * makes and frees ten tuples a call, and on 3.12 a tuple's allocation and
 * release (with its trashcan) cost more than the rest of the dict's visit.
 * A popped frame's tuple that nothing else holds is emptied (its items let
 * go of, set to NULL) and kept here for the next frame of that size, up to
 * SPARE_PER_SIZE of each size up to SPARE_MAX, in the module's state. A spare
 * tuple is referenced only from there and is untracked by the collector (it is tracked again when
 * taken): no user code can reach it (not even through gc.get_objects()),
 * and its NULL items are what tuple's own release expects of a tuple being
 * filled. */

/* A tuple of n NULL items, to be filled as PyTuple_New's: a spare one when
 * there is one. New reference. */
PK_SHARED PyObject *
spare_tuple(PkState *st, Py_ssize_t n)
{
    if (SPARE_TUPLES && n > 0 && n <= SPARE_MAX && st->spare_n[n] > 0) {
        PyObject *t = st->spare[n][--st->spare_n[n]];
        if (!PyObject_GC_IsTracked(t)) {
            PyObject_GC_Track(t);
        }
        return t;
    }
    return PyTuple_New(n);
}

/* A tuple of n items, each a new reference to ch[i] (spare_tuple). New
 * reference. */
PK_SHARED PyObject *
children_tuple(PkState *st, PyObject *const *ch, Py_ssize_t n)
{
    PyObject *t = spare_tuple(st, n);
    if (t == NULL) {
        return NULL;
    }
    PyObject **items = ((PyTupleObject *)t)->ob_item;
    for (Py_ssize_t i = 0; i < n; i++) {
        items[i] = Py_NewRef(ch[i]);
    }
    return t;
}

/* Let go of a frame's children (a reference owned by the caller): an exact
 * tuple that only this reference holds is emptied and kept as a spare. The
 * items' release may run code (finalizers), which may flatten again and
 * take or keep spares meanwhile: the room is looked at after. */
static void
children_release(PkState *st, PyObject *t)
{
    Py_ssize_t n;
    if (!SPARE_TUPLES || !PyTuple_CheckExact(t) || Py_REFCNT(t) != 1 ||
        (n = PyTuple_GET_SIZE(t)) == 0 ||
        n > SPARE_MAX || st->spare_n[n] == SPARE_PER_SIZE) {
        Py_DECREF(t);
        return;
    }
    /* untracked first: a finalizer run by the release below could otherwise
     * find it in gc.get_objects() with NULL items */
    if (PyObject_GC_IsTracked(t)) {
        PyObject_GC_UnTrack(t);
    }
    PyObject **items = ((PyTupleObject *)t)->ob_item;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_CLEAR(items[i]);
    }
    if (st->spare_n[n] < SPARE_PER_SIZE) {
        st->spare[n][st->spare_n[n]++] = t;
    }
    else {
        Py_DECREF(t);
    }
}

static void
frame_clear(PkState *st, Frame *f)
{
    Py_CLEAR(f->obj);
    PyObject *children = f->children;
    if (children != NULL) {
        f->children = NULL;
        children_release(st, children);
    }
    Py_CLEAR(f->names);
}

PK_SHARED void
stack_clear(Stack *s)
{
    for (Py_ssize_t i = 0; i < s->n; i++) {
        frame_clear(s->st, &s->v[i]);
    }
    if (s->v != s->inline_v) {
        PyMem_Free(s->v);
    }
    PyMem_Free(s->set);
    PyMem_Free(s->counts);
    if (s->view != NULL) {
        ((StackView *)s->view)->s = NULL;
        Py_DECREF(s->view);
    }
    stack_init(s, s->st);
}

static Py_ssize_t
set_slot(Stack *s, void *p)
{
    size_t h = ptr_hash(p);
    Py_ssize_t mask = s->set_cap - 1;
    Py_ssize_t i = (Py_ssize_t)(h & (size_t)mask);
    while (s->set[i] != NULL && s->set[i] != p) {
        i = (i + 1) & mask;
    }
    return i;
}

static int set_insert(Stack *s, void *p);

static int
set_grow(Stack *s)
{
    void **old = s->set;
    Py_ssize_t oldcap = s->set_cap;
    Py_ssize_t cap = oldcap ? oldcap * 2 : 256;
    void **nw = PyMem_Calloc(cap, sizeof(void *));
    if (nw == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    s->set = nw;
    s->set_cap = cap;
    s->set_n = 0;
    for (Py_ssize_t i = 0; i < oldcap; i++) {
        if (old[i] != NULL) {
            s->set[set_slot(s, old[i])] = old[i];
            s->set_n++;
        }
    }
    PyMem_Free(old);
    return 0;
}

static int
set_insert(Stack *s, void *p)
{
    if ((s->set_n + 1) * 2 > s->set_cap && set_grow(s) < 0) {
        return -1;
    }
    Py_ssize_t i = set_slot(s, p);
    if (s->set[i] == NULL) {
        s->set[i] = p;
        s->set_n++;
    }
    return 0;
}

static void
set_remove(Stack *s, void *p)
{
    Py_ssize_t mask = s->set_cap - 1;
    Py_ssize_t i = set_slot(s, p);
    if (s->set[i] == NULL) {
        return;
    }
    s->set[i] = NULL;
    s->set_n--;
    /* backward-shift deletion for linear probing */
    Py_ssize_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        void *q = s->set[j];
        if (q == NULL) {
            break;
        }
        size_t h = ptr_hash(q);
        Py_ssize_t k = (Py_ssize_t)(h & (size_t)mask);
        /* move q to i when its home k is not cyclically in (i, j] */
        if ((i <= j) ? (i < k && k <= j) : (i < k || k <= j)) {
            continue;
        }
        s->set[i] = q;
        s->set[j] = NULL;
        i = j;
    }
}

/* The counts start at COUNTS_FROM_DEPTH with NCOUNTS slots and grow to
 * NCOUNTS_DEEP at COUNTS_DEEP_FROM: with d frames on the stack, a container
 * not on it is scanned for with probability about 1 - exp(-d / slots), so
 * 256 slots scanned a depth-200 stack for over half the containers (15% of a
 * depth-200 chain's flatten in callgrind); 2,048 slots scan it for 9%.
 * Growing them earlier costs more than it saves on trees of 50 deep (a 2 KiB
 * table, cleared, and the frames counted again). From SET_FROM_DEPTH the
 * pointer set answers instead of the scan. A count is a byte: one that
 * reaches COUNT_STUCK is never lowered again, so that slot says "maybe"
 * (scan or set) from then on, never a wrong "not held". */
#define SET_FROM_DEPTH 256
#define COUNTS_FROM_DEPTH 8
#define NCOUNTS 256
#define COUNTS_DEEP_FROM 64
#define NCOUNTS_DEEP 2048
#define COUNT_STUCK 255

static inline size_t
count_slot(Stack *s, void *p)
{
    return (ptr_hash(p) >> 48) & s->counts_mask;
}

static inline void
count_up(Stack *s, void *p)
{
    uint8_t *c = &s->counts[count_slot(s, p)];
    *c += *c != COUNT_STUCK;
}

static inline void
count_down(Stack *s, void *p)
{
    uint8_t *c = &s->counts[count_slot(s, p)];
    *c -= *c != COUNT_STUCK;
}

/* (Re)make the counts with n slots from the frames on the stack. */
static int
counts_make(Stack *s, size_t n)
{
    uint8_t *counts = PyMem_Calloc(n, 1);
    if (counts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyMem_Free(s->counts);
    s->counts = counts;
    s->counts_mask = n - 1;
    for (Py_ssize_t i = 0; i < s->n; i++) {
        count_up(s, s->v[i].obj);
    }
    return 0;
}

/* Is obj the object of a frame on the stack? -1 on error (no memory). */
PK_SHARED int
stack_holds(Stack *s, PyObject *obj)
{
    if (s->n >= COUNTS_FROM_DEPTH && s->counts_mask < NCOUNTS_DEEP - 1) {
        if (s->counts == NULL && counts_make(s, NCOUNTS) < 0) {
            return -1;
        }
        if (s->n >= COUNTS_DEEP_FROM && counts_make(s, NCOUNTS_DEEP) < 0) {
            return -1;
        }
    }
    if (s->counts != NULL && s->counts[count_slot(s, obj)] == 0) {
        return 0;
    }
    if (s->set != NULL) {
        return s->set[set_slot(s, obj)] == obj;
    }
    for (Py_ssize_t i = 0; i < s->n; i++) {
        if (s->v[i].obj == obj) {
            return 1;
        }
    }
    return 0;
}

/* Push a frame; steals children and names. */
PK_SHARED int
stack_push(Stack *s, PyObject *obj, PyObject *children, PyObject *names, int keymode, int live,
           int track)
{
    if (s->n == s->cap) {
        void *v = s->v;
        if (grow_array(&v, s->inline_v, s->n, &s->cap, sizeof(Frame), 0) < 0) {
            Py_DECREF(children);
            Py_XDECREF(names);
            return -1;
        }
        s->v = v;
    }
    if (track) {
        if (s->set == NULL && s->n >= SET_FROM_DEPTH) {
            for (Py_ssize_t i = 0; i < s->n; i++) {
                if (set_insert(s, s->v[i].obj) < 0) {
                    Py_DECREF(children);
                    Py_XDECREF(names);
                    return -1;
                }
            }
        }
        if (s->set != NULL && set_insert(s, obj) < 0) {
            Py_DECREF(children);
            Py_XDECREF(names);
            return -1;
        }
        if (s->counts != NULL) {
            count_up(s, obj);
        }
    }
    Frame *f = &s->v[s->n++];
    Py_INCREF(obj);
    f->obj = obj;
    f->children = children;
    f->names = names;
    f->pos = 0;
    f->n = PyTuple_Check(children) ? PyTuple_GET_SIZE(children) : PyList_GET_SIZE(children);
    f->keymode = keymode;
    f->live = live;
    s->nlive += live;
    return 0;
}

static void
stack_pop(Stack *s)
{
    Frame *f = &s->v[--s->n];
    if (s->set != NULL) {
        set_remove(s, f->obj);
    }
    if (s->counts != NULL) {
        count_down(s, f->obj);
    }
    s->nlive -= f->live;
    frame_clear(s->st, f);
}

/* The pure engine copies a list when it meets it. The C engine reads the
 * list itself for as long as no user code can run, and copies every list
 * still being read just before anything that could run user code (is_leaf,
 * __tree_flatten__, a rule, an attribute, a key's __lt__ or __eq__, ...):
 * until then the list cannot have changed, so the copy is the same. */
PK_SHARED int
stack_freeze(Stack *s)
{
    for (Py_ssize_t i = s->n - 1; s->nlive > 0 && i >= 0; i--) {
        Frame *f = &s->v[i];
        if (f->live) {
            PyObject *tup = PyList_AsTuple(f->children);
            if (tup == NULL) {
                return -1;
            }
            Py_SETREF(f->children, tup);
            f->live = 0;
            s->nlive--;
        }
    }
    return 0;
}

/* Only a finalizer run by the garbage collector could change a list being
 * read; never read past its end if one did. */
static int
frame_check(Frame *f)
{
    if (f->live && PyList_GET_SIZE(f->children) != f->n) {
        PyErr_SetString(PyExc_RuntimeError, "a list changed size while it was being flattened");
        return -1;
    }
    return 0;
}

/* The stack as the pure engine's helpers see it: a read-only sequence whose
 * items are frames in the pure engine's format, [children, position,
 * keymode, names, obj], made only when read (which is when an error message
 * needs the path). One view per call, made when first needed; when the call
 * returns it is detached and reads as empty, so nothing dangles if a
 * traceback keeps it. It holds no Python objects, so it needs no GC. */


static Py_ssize_t
sv_len(PyObject *self)
{
    Stack *s = ((StackView *)self)->s;
    return s ? s->n : 0;
}

static PyObject *
sv_item(PyObject *self, Py_ssize_t i)
{
    Stack *s = ((StackView *)self)->s;
    if (s == NULL || i < 0 || i >= s->n) {
        PyErr_SetString(PyExc_IndexError, "stack index out of range");
        return NULL;
    }
    Frame *f = &s->v[i];
    return Py_BuildValue("[OniOO]", f->children, f->pos, f->keymode,
                         f->names ? f->names : Py_None, f->obj);
}

static PySequenceMethods sv_as_sequence = {
    .sq_length = sv_len,
    .sq_item = sv_item,
};

PK_DATA PyTypeObject StackView_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "pytree_kit._speedups.StackView",
    .tp_basicsize = sizeof(StackView),
    .tp_dealloc = (destructor)PyObject_Free,
    .tp_as_sequence = &sv_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The C engine's traversal stack, read by the pure engine's error helpers.",
};

/* A new reference to the stack's view (made on first use). */
PK_SHARED PyObject *
stack_py(Stack *s)
{
    if (s->view == NULL) {
        StackView *v = PyObject_New(StackView, &StackView_Type);
        if (v == NULL) {
            return NULL;
        }
        v->s = s;
        s->view = (PyObject *)v;
    }
    Py_INCREF(s->view);
    return s->view;
}

PK_SHARED_INLINE PyObject *
frame_item(Frame *f, Py_ssize_t i)
{
    return PyTuple_Check(f->children) ? PyTuple_GET_ITEM(f->children, i)
                                      : PyList_GET_ITEM(f->children, i);
}

/* The frame a walk reads its next child from: the top frame with a child
 * left to read, the frames above it that have none popped. Returns 1 with
 * *out set, 0 when every frame is read, -1 when the frame's list changed
 * size (frame_check). flatten's and flatten_up_to's walks move on with it
 * and frame_next. */
PK_SHARED_INLINE int
stack_unread(Stack *s, Frame **out)
{
    while (s->n) {
        Frame *fr = &s->v[s->n - 1];
        if (fr->pos < fr->n) {
            *out = fr;
            return frame_check(fr) < 0 ? -1 : 1;
        }
        stack_pop(s);
    }
    return 0;
}

/* fr's next child (a new reference; *at its position), its list checked
 * again first; NULL on error. */
PK_SHARED_INLINE PyObject *
frame_next(Frame *fr, Py_ssize_t *at)
{
    if (frame_check(fr) < 0) {
        return NULL;
    }
    *at = fr->pos++;
    return Py_NewRef(frame_item(fr, *at));
}

/* Path keys (_keys.py) are made without calling their class, whose
 * __init__ only sets the one slot: the type allocates the instance and the
 * slot's member descriptor sets it, both through public type slots. key_init
 * checks on import that a key made so equals one made by the class, with the
 * same slot and no __dict__; where anything differs, the class is called. */
static PyObject *key_class[3]; /* borrowed: SequenceKey_t, DictKey_t, GetAttrKey_t */
static PyObject *key_slot[3];  /* strong member descriptors, or NULL: call the class */

PyObject *
pk_key(int which, PyObject *value)
{
    PyTypeObject *t = (PyTypeObject *)key_class[which];
    PyObject *d = key_slot[which];
    if (d == NULL) {
        return PyObject_CallOneArg((PyObject *)t, value);
    }
    PyObject *k = t->tp_alloc(t, 0);
    if (k != NULL && Py_TYPE(d)->tp_descr_set(d, k, value) < 0) {
        Py_CLEAR(k);
    }
    return k;
}

PyObject *
pk_key_class(int which)
{
    return key_class[which];
}

/* What a key of class key_class[which] holds (its idx, key or name): a new
 * reference, read through the slot's member descriptor, or by getattr where
 * key_init found none. */
PyObject *
pk_key_value(int which, PyObject *k)
{
    static const char *const names[3] = {"idx", "key", "name"};
    PyObject *d = key_slot[which];
    if (d == NULL) {
        return PyObject_GetAttrString(k, names[which]);
    }
    return Py_TYPE(d)->tp_descr_get(d, k, key_class[which]);
}

/* Whether pk_key's own way makes, for value, what the class makes. */
static int
key_same(int which, const char *slot, PyObject *value)
{
    PyObject *mine = pk_key(which, value);
    PyObject *theirs = PyObject_CallOneArg(key_class[which], value);
    int same = 0;
    if (mine != NULL && theirs != NULL && Py_TYPE(mine) == Py_TYPE(theirs) &&
        !PyObject_HasAttrString(mine, "__dict__")) {
        PyObject *a = PyObject_GetAttrString(mine, slot), *b = PyObject_GetAttrString(theirs, slot);
        same = a != NULL && a == b && a == value &&
               PyObject_RichCompareBool(mine, theirs, Py_EQ) == 1 &&
               PyObject_Hash(mine) == PyObject_Hash(theirs);
        Py_XDECREF(a);
        Py_XDECREF(b);
    }
    Py_XDECREF(mine);
    Py_XDECREF(theirs);
    PyErr_Clear();
    return same;
}

PK_SHARED int
key_init(void)
{
    static const char *const slots[3] = {"idx", "key", "name"};
    key_class[PK_KEY_SEQUENCE] = SequenceKey_t;
    key_class[PK_KEY_DICT] = DictKey_t;
    key_class[PK_KEY_ATTR] = GetAttrKey_t;
    for (int w = 0; w < 3; w++) {
        PyTypeObject *t = (PyTypeObject *)key_class[w];
        PyObject *d = PyObject_GetAttrString(key_class[w], slots[w]);
        if (d == NULL) {
            return -1;
        }
        if (!PyType_Check(key_class[w]) || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
            Py_TYPE(d)->tp_descr_set == NULL || t->tp_alloc == NULL ||
            t->tp_new != PyBaseObject_Type.tp_new) {
            Py_DECREF(d);
            continue;
        }
        key_slot[w] = d;
        PyObject *probe = w == PK_KEY_SEQUENCE ? PyLong_FromLong(3) : PyUnicode_FromString("k");
        if (probe == NULL) {
            return -1;
        }
        if (!key_same(w, slots[w], probe)) {
            Py_CLEAR(key_slot[w]);
        }
        Py_DECREF(probe);
    }
    return 0;
}

/* The key of the child being visited in frame f, as _messages.frame_key. */
PK_SHARED PyObject *
frame_key(Frame *f, Py_ssize_t i)
{
    if (f->keymode == KM_SEQ) {
        PyObject *idx = PyLong_FromSsize_t(i);
        if (idx == NULL) {
            return NULL;
        }
        PyObject *k = pk_key(PK_KEY_SEQUENCE, idx);
        Py_DECREF(idx);
        return k;
    }
    PyObject *name = PySequence_GetItem(f->names, i);
    if (name == NULL) {
        return NULL;
    }
    PyObject *k = pk_key(f->keymode == KM_MAP ? PK_KEY_DICT : PK_KEY_ATTR, name);
    Py_DECREF(name);
    return k;
}
