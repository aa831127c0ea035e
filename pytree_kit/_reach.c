/* first_reaching: which leaf may reach an instance of a class, through the
 * references the garbage collector sees. pytree_kit/_reach.py is the
 * specification (read it first); this file gives the same answers.
 *
 * The search is iterative: an explicit stack of strong references, and a set
 * of the addresses met. Nothing inside a tp_traverse callback runs Python
 * code (types are compared by address and by their MRO), so the object being
 * traversed cannot change under it. The registry test, which hashes a class,
 * runs between traversals, on objects the stack keeps alive.
 */
#include "_for_torch.h"

#define TYPES 256 /* classes remembered per call; more are worked out each time */
enum { PASS = 1, TARGET = 2, ENTER = 3, KIND = 3, REG_KNOWN = 4, REG_YES = 8 };

typedef struct {
    PyObject **stack; /* strong references: the objects to take up */
    Py_ssize_t len, cap;
    PyObject **taken; /* strong references: the objects taken up */
    Py_ssize_t ntaken, taken_cap;
    void **seen;      /* open addressing on the address; NULL is empty */
    size_t seen_mask; /* capacity - 1, a power of two */
    Py_ssize_t seen_len;
    PyTypeObject *target;
    PyObject *skip;   /* tuple of types, compared by address */
    PyObject *opaque; /* tuple of types, compared with their subclasses */
    int found;
    /* what each class met is, worked out once per call: the classes are held
     * (strong references) so that none is freed and its address reused */
    struct {
        PyTypeObject *type;
        unsigned char what; /* PASS, TARGET or ENTER, | REG_KNOWN | REG_YES */
    } types[TYPES];
    int ntypes;
} Search;

static int
is_sub(PyTypeObject *t, PyObject *types)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); i++) {
        if (PyType_IsSubtype(t, (PyTypeObject *)PyTuple_GET_ITEM(types, i))) {
            return 1;
        }
    }
    return 0;
}

static int
is_skipped(PyTypeObject *t, PyObject *skip)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(skip); i++) {
        if ((PyObject *)t == PyTuple_GET_ITEM(skip, i)) {
            return 1;
        }
    }
    return 0;
}

static size_t
slot_of(const void *p, size_t mask)
{
    uintptr_t h = (uintptr_t)p;
    h ^= h >> 17;
    h *= (uintptr_t)0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 7) & mask;
}

/* 1 when added, 0 when already there, -1 on memory error */
static int
seen_add(Search *s, void *p)
{
    if ((size_t)(s->seen_len + 1) * 2 > s->seen_mask + 1) {
        size_t cap = (s->seen_mask + 1) * 2;
        void **table = PyMem_Calloc(cap, sizeof(void *));
        if (table == NULL) {
            return -1;
        }
        for (size_t i = 0; i <= s->seen_mask; i++) {
            if (s->seen[i] != NULL) {
                size_t j = slot_of(s->seen[i], cap - 1);
                while (table[j] != NULL) {
                    j = (j + 1) & (cap - 1);
                }
                table[j] = s->seen[i];
            }
        }
        PyMem_Free(s->seen);
        s->seen = table;
        s->seen_mask = cap - 1;
    }
    size_t j = slot_of(p, s->seen_mask);
    while (s->seen[j] != NULL) {
        if (s->seen[j] == p) {
            return 0;
        }
        j = (j + 1) & s->seen_mask;
    }
    s->seen[j] = p;
    s->seen_len++;
    return 1;
}

static int
grow(PyObject ***items, Py_ssize_t *cap)
{
    Py_ssize_t n = *cap * 2;
    PyObject **more = PyMem_Realloc(*items, (size_t)n * sizeof(PyObject *));
    if (more == NULL) {
        return -1;
    }
    *items = more;
    *cap = n;
    return 0;
}

static int
push(Search *s, PyObject *obj)
{
    if (s->len == s->cap && grow(&s->stack, &s->cap) < 0) {
        return -1;
    }
    Py_INCREF(obj);
    s->stack[s->len++] = obj;
    return 0;
}

/* What an instance of t is to the search: PASS, TARGET or ENTER. */
static unsigned char
classify(Search *s, PyTypeObject *t)
{
    return is_skipped(t, s->skip)             ? PASS
           : PyType_IsSubtype(t, s->target) ? TARGET
           : is_sub(t, s->opaque)            ? PASS
                                             : ENTER;
}

/* The entry for t in s->types, made (with its kind) when there is room;
 * NULL when the table is full. No Python code runs here. */
static unsigned char *
type_entry(Search *s, PyTypeObject *t)
{
    size_t j = slot_of(t, TYPES - 1);
    for (int probes = 0; probes < TYPES; probes++, j = (j + 1) & (TYPES - 1)) {
        if (s->types[j].type == t) {
            return &s->types[j].what;
        }
        if (s->types[j].type == NULL) {
            if (s->ntypes * 4 >= TYPES * 3) {
                return NULL;
            }
            Py_INCREF(t);
            s->types[j].type = t;
            s->ntypes++;
            s->types[j].what = classify(s, t);
            return &s->types[j].what;
        }
    }
    return NULL;
}

static int
kind_of(Search *s, PyTypeObject *t)
{
    unsigned char *what = type_entry(s, t);
    if (what != NULL) {
        return *what & KIND;
    }
    return classify(s, t);
}

/* the tp_traverse callback: no Python code runs here */
static int
visit(PyObject *c, void *arg)
{
    Search *s = (Search *)arg;
    int kind = kind_of(s, Py_TYPE(c));
    if (kind == PASS) {
        return 0;
    }
    if (kind == TARGET) {
        s->found = 1;
        return 1;
    }
    int added = seen_add(s, c);
    if (added <= 0) {
        return added; /* met before: 0; out of memory: -1 stops the traversal */
    }
    return push(s, c);
}

/* whether x's class is in registered: 1, 0, or -1 with an error set (the
 * lookup hashes the class, which may run Python code: never inside visit) */
static int
is_registered(Search *s, PyObject *x, PyObject *registered)
{
    unsigned char *what = type_entry(s, Py_TYPE(x));
    if (what != NULL && (*what & REG_KNOWN)) {
        return (*what & REG_YES) != 0;
    }
    int hit = PySequence_Contains(registered, (PyObject *)Py_TYPE(x));
    if (hit >= 0 && what != NULL) {
        what = type_entry(s, Py_TYPE(x)); /* x is held: its class is too */
        if (what != NULL) {
            *what |= REG_KNOWN | (hit ? REG_YES : 0);
        }
    }
    return hit;
}

static void
search_clear(Search *s)
{
    while (s->len > 0) {
        Py_DECREF(s->stack[--s->len]);
    }
    while (s->ntaken > 0) {
        Py_DECREF(s->taken[--s->ntaken]);
    }
    if (s->seen_mask > 63) { /* a large search: the next starts small again */
        void **small = PyMem_Calloc(64, sizeof(void *));
        if (small != NULL) {
            PyMem_Free(s->seen);
            s->seen = small;
            s->seen_mask = 63;
            s->seen_len = 0;
        }
    }
    if (s->seen_len > 0) {
        memset(s->seen, 0, (s->seen_mask + 1) * sizeof(void *));
        s->seen_len = 0;
    }
    s->found = 0;
}

/* 1: may reach; 0: does not; -1: error set. The caller clears s after. */
static int
may_reach(Search *s, PyObject *obj, PyObject *registered, Py_ssize_t limit)
{
    if (seen_add(s, obj) < 0 || push(s, obj) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    while (s->len > 0 && s->ntaken < limit) {
        if (s->ntaken == s->taken_cap && grow(&s->taken, &s->taken_cap) < 0) {
            PyErr_NoMemory();
            return -1;
        }
        PyObject *x = s->stack[--s->len];
        s->taken[s->ntaken++] = x; /* the reference moves: x stays alive */
        int hit = is_registered(s, x, registered);
        if (hit != 0) {
            return hit; /* 1, or -1 with the error set */
        }
        traverseproc traverse = Py_TYPE(x)->tp_traverse;
        if (!PyObject_IS_GC(x) || traverse == NULL) {
            continue;
        }
        if (traverse(x, visit, s) != 0 && !s->found) {
            PyErr_NoMemory();
            return -1;
        }
        if (s->found) {
            return 1;
        }
    }
    return s->len > 0;
}

PK_INTERNAL PyObject *
pk_first_reaching(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "first_reaching() takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *leaves = args[0], *target = args[2], *skip = args[3], *opaque = args[4];
    PyObject *registered = args[5];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[6]);
    if ((start == -1 || limit == -1) && PyErr_Occurred()) {
        return NULL;
    }
    if (!PyList_Check(leaves) || !PyType_Check(target) || !PyTuple_Check(skip) ||
        !PyTuple_Check(opaque)) {
        PyErr_SetString(PyExc_TypeError,
                        "first_reaching(leaves: list, start, target: type, skip: tuple, "
                        "opaque: tuple, registered, limit)");
        return NULL;
    }
    for (int k = 0; k < 2; k++) {
        PyObject *types = k ? opaque : skip;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); i++) {
            if (!PyType_Check(PyTuple_GET_ITEM(types, i))) {
                PyErr_SetString(PyExc_TypeError, "first_reaching: skip and opaque hold types");
                return NULL;
            }
        }
    }
#ifdef Py_GIL_DISABLED
    /* Where the GIL can be off another thread may change an object while its
     * tp_traverse visits it here: the specification's search is run instead
     * (gc.get_referents, which stops the other threads while it reads), on
     * the arguments checked as above */
    {
        PyObject *spec = PyImport_ImportModule("pytree_kit._reach"), *fn = NULL, *r = NULL;
        if (spec != NULL && (fn = PyObject_GetAttrString(spec, "first_reaching")) != NULL) {
            r = PyObject_Vectorcall(fn, args, (size_t)nargs, NULL);
        }
        Py_XDECREF(fn);
        Py_XDECREF(spec);
        return r;
    }
#endif
    Search s = {0};
    s.target = (PyTypeObject *)target;
    s.skip = skip;
    s.opaque = opaque;
    s.cap = s.taken_cap = 16;
    s.seen_mask = 63;
    s.stack = PyMem_Malloc(16 * sizeof(PyObject *));
    s.taken = PyMem_Malloc(16 * sizeof(PyObject *));
    s.seen = PyMem_Calloc(64, sizeof(void *));
    Py_ssize_t found = -1;
    int failed = 0;
    if (s.stack == NULL || s.taken == NULL || s.seen == NULL) {
        PyErr_NoMemory();
        failed = 1;
    }
    /* the list may change while registered's lookups run Python code: read
     * its length and items each time, holding the item */
    for (Py_ssize_t i = start < 0 ? 0 : start; !failed && i < PyList_GET_SIZE(leaves); i++) {
        PyObject *x = PyList_GET_ITEM(leaves, i);
        if (kind_of(&s, Py_TYPE(x)) != ENTER) {
            continue;
        }
        Py_INCREF(x);
        int r = may_reach(&s, x, registered, limit);
        Py_DECREF(x);
        search_clear(&s);
        if (r < 0) {
            failed = 1;
        }
        else if (r > 0) {
            found = i;
            break;
        }
    }
    search_clear(&s);
    for (int j = 0; j < TYPES; j++) {
        Py_XDECREF(s.types[j].type);
    }
    PyMem_Free(s.stack);
    PyMem_Free(s.taken);
    PyMem_Free(s.seen);
    return failed ? NULL : PyLong_FromSsize_t(found);
}
