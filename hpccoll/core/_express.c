/* The per-call path of a collective the MPI library runs itself, in C.
 *
 * At 8 B, hpccoll's own Python around MPI's collective (naming, the ledger, the task,
 * the loose registration, then the waiter's test loop and the completion) cost about
 * 4 us per collective against MPI's 1-2 (docs/performance.md, "per-call cost").  These
 * two functions do the same steps, on the same Python objects, in one call each:
 *
 *   issue(state, call) -> Task, or None
 *       CommState.issue's loose route (core/state.py): the next sequence number, the
 *       ledger's record, the lane and the task, MPI's collective started (a persistent
 *       request: the input copied into its staging array, then Start), the task loose.
 *       None, with nothing changed, wherever that route does not apply or something
 *       unusual comes first (the digest check is due, the previous collective has not
 *       posted, the persistent request is busy or not made yet, avg, in place, a
 *       signature the state has no plan for yet, ...): the Python path then takes the
 *       call, as it always did.
 *
 *   wait(task, timeout) -> bool
 *       Engine.wait_loose's first spin (engine/engine.py) for a loose task MPI runs:
 *       up to spin_polls tests of its request (and, with no timeout, yield_polls more
 *       with sched_yield between them, as there); on completion the result out of the
 *       staging array and Engine._done_loose's steps.  False, with nothing changed but
 *       MPI's progress, where it did not complete (the Python waiter goes on from there)
 *       or the engine has work of its own.  An error MPI raises goes to the engine as
 *       the Python waiter's would (Engine._adopt_loose).
 *
 * Nothing here calls MPI itself: the requests' methods are mpi4py's, so a site MPI is
 * as welcome as the embedded one.  The GIL is held throughout except inside those
 * methods, as in the Python code; the communicator's lock and the engine's xlock are
 * taken exactly where that code takes them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#if PY_VERSION_HEX < 0x030A0000   /* (Python 3.9) */
static inline PyObject *Py_NewRef(PyObject *o) {
    Py_INCREF(o);
    return o;
}
#endif

static PyObject *Task, *MpiLane, *RUNNING, *DONE, *FAILED;
static long long SLOTS = 16;
static const uint64_t MASK = (1ULL << 62) - 1, MIX = 1000003ULL;
static long long issued, completed, failed_starts;   /* for tests: that this path runs */

#define NAMES(X)                                                                        \
    X(recipe) X(early) X(fast) X(engine) X(divisor) X(persist) X(kind) X(inplace)       \
    X(send) X(recv) X(result) X(ledger) X(lock) X(seq) X(every) X(last) X(posted)       \
    X(state) X(slots) X(uses) X(busy) X(req) X(root) X(rank) X(digest) X(fp) X(fp_hash) \
    X(window) X(fps) X(digests) X(slot) X(done) X(_engine) X(comm) X(plan) X(key)       \
    X(lane) X(check) X(t_issue) X(last_progress) X(t_start) X(loose)   \
    X(acquire) X(release) X(Start) X(Test) X(post) X(mop) X(xlock) X(_live) X(sq)       \
    X(loose_programs) X(settings) X(spin_polls) X(t_end) X(app_active) X(retired)       \
    X(flight) X(ring) X(append) X(_done) X(_adopt_loose) X(poll_error) \
    X(_express_failed) X(plans) X(cx) \
    X(yield_polls) X(device) X(layout) X(coll) X(count) X(op) X(dtype) X(reg_matters) X(ctx) X(_allocs)
#define DECLARE(n) static PyObject *S_##n;
NAMES(DECLARE)
#define GET(o, n) PyObject_GetAttr((o), S_##n)
#define SET(o, n, v) PyObject_SetAttr((o), S_##n, (v))

/* the raised exception, taken (NULL: none), and raised again (3.11 has no
 * PyErr_GetRaisedException) */
static PyObject *take_exception(void) {
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    if (t == NULL)
        return NULL;
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(v, tb);
        Py_DECREF(tb);
    }
    Py_DECREF(t);
    return v;
#endif
}

static void restore_exception(PyObject *v) {
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(v);
#else
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(v)), v, PyException_GetTraceback(v));
#endif
}

static PyObject *monotonic(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return PyFloat_FromDouble((double)ts.tv_sec + ts.tv_nsec * 1e-9);
}

/* 1 if attribute n of o is True, 0 if not, -1 on error */
static int is_true(PyObject *o, PyObject *n) {
    PyObject *v = PyObject_GetAttr(o, n);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

static int call_lock(PyObject *lock, PyObject *name) {
    PyObject *r = PyObject_CallMethodNoArgs(lock, name);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

static long long as_ll(PyObject *o, PyObject *n) {
    PyObject *v = PyObject_GetAttr(o, n);
    if (v == NULL)
        return -1;
    long long r = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return r;
}

/* copy src's bytes into dst (both C-contiguous, the same length); -1 with nothing
 * copied (and no error set) where either is not such a buffer */
static int copy_into(PyObject *dst, PyObject *src) {
    Py_buffer d, s;
    if (PyObject_GetBuffer(dst, &d, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        return -1;
    }
    if (PyObject_GetBuffer(src, &s, PyBUF_C_CONTIGUOUS) < 0) {
        PyErr_Clear();
        PyBuffer_Release(&d);
        return -1;
    }
    int ok = d.len == s.len;
    if (ok && d.len)
        memmove(d.buf, s.buf, (size_t)d.len);
    PyBuffer_Release(&s);
    PyBuffer_Release(&d);
    return ok ? 0 : -1;
}

static PyObject *bind(PyObject *m, PyObject *args) {
    PyObject *task, *lane, *running, *done, *failed;
    long long slots;
    if (!PyArg_ParseTuple(args, "OOOOOL", &task, &lane, &running, &done, &failed, &slots))
        return NULL;
    Py_XSETREF(Task, Py_NewRef(task));
    Py_XSETREF(MpiLane, Py_NewRef(lane));
    Py_XSETREF(RUNNING, Py_NewRef(running));
    Py_XSETREF(DONE, Py_NewRef(done));
    Py_XSETREF(FAILED, Py_NewRef(failed));
    SLOTS = slots;
    Py_RETURN_NONE;
}

/* the previous order-matched task has posted its MPI calls (task.started) */
static int prev_started(PyObject *st) {
    PyObject *last = GET(st, last);
    if (last == NULL)
        return -1;
    if (last == Py_None) {
        Py_DECREF(last);
        return 1;
    }
    PyObject *prev = PyObject_CallNoArgs(last);   /* a weak reference */
    Py_DECREF(last);
    if (prev == NULL)
        return -1;
    int r = 1;
    if (prev != Py_None) {
        r = is_true(prev, S_posted);
        if (r == 0) {
            PyObject *state = GET(prev, state);
            if (state == NULL)
                r = -1;
            else
                r = state == FAILED;
            Py_XDECREF(state);
        }
    }
    Py_DECREF(prev);
    return r;
}

enum { K_OTHER, K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_ALLTOALL, K_BARRIER, K_REDUCE,
       K_REDUCE_SCATTER };

static int kind_of(PyObject *kind) {
    static const char *names[] = {"", "allreduce", "broadcast", "allgather", "alltoall",
                                  "barrier", "reduce", "reduce_scatter"};
    for (int k = 1; k < 8; k++)
        if (PyUnicode_CompareWithASCIIString(kind, names[k]) == 0)
            return k;
    return K_OTHER;
}

/* What the calls read of a plan, a communicator's state and the engine that does not
 * change once they exist, gathered at the first use into a tuple kept on the object
 * (its ``cx`` field): one read instead of a dozen per call.  A state's plan cache is
 * not among them (a calibration swaps it), nor anything a call changes. */
enum { PX_OK, PX_RECIPE, PX_KIND, PX_PERSIST, PX_BROOT, PX_FP, PX_HASH, PX_REGM, PX_N };
enum { SX_ENGINE, SX_LOCK, SX_LEDGER, SX_PERSIST, SX_LOOSE, SX_OK, SX_FPS, SX_DIGESTS,
       SX_EVERY, SX_WINDOW, SX_N };
enum { EX_XLOCK, EX_LOOSE, EX_PROGRAMS, EX_SQ, EX_POLLS, EX_YIELDS, EX_RING, EX_N };

/* o.cx, or (o.cx None) what make(o) gathers, kept there; a new reference */
static PyObject *info(PyObject *o, PyObject *(*make)(PyObject *)) {
    PyObject *cx = GET(o, cx);
    if (cx == NULL || cx != Py_None)
        return cx;
    Py_DECREF(cx);
    if ((cx = make(o)) != NULL && SET(o, cx, cx) < 0)
        Py_CLEAR(cx);
    return cx;
}

/* a plan: whether the C route applies to it at all (MPI's own collective, started at
 * issue, no avg, a kind it knows, in place only through a persistent request's copy),
 * then the recipe, kind, persistent set key, whether this rank is a broadcast's root,
 * the fingerprint and its hash, reg_matters */
static PyObject *plan_info(PyObject *plan) {
    PyObject *recipe = NULL, *persist = NULL, *kindo = NULL, *fp = NULL, *hash = NULL,
             *kind = NULL, *out = NULL;
    int ok, broot = 0, k = K_OTHER, regm;
    if ((recipe = GET(plan, recipe)) == NULL)
        goto out;
    ok = recipe != Py_None;
    if (ok) {
        if ((ok = is_true(plan, S_early)) < 0)
            goto out;
        int avg = is_true(recipe, S_divisor);
        if (avg < 0 || (persist = GET(recipe, persist)) == NULL ||
            (kindo = GET(recipe, kind)) == NULL)
            goto out;
        k = kind_of(kindo);
        ok = ok && !avg && k != K_OTHER;
        if (ok && persist == Py_None && k != K_BROADCAST && k != K_BARRIER) {
            int inplace = is_true(recipe, S_inplace);
            if (inplace < 0)
                goto out;
            ok = !inplace;
        }
        if (k == K_BROADCAST) {
            long long rank = as_ll(recipe, S_rank), root = as_ll(recipe, S_root);
            if (PyErr_Occurred())
                goto out;
            broot = rank == root;
        }
    } else {
        persist = Py_NewRef(Py_None);
    }
    if ((regm = is_true(plan, S_reg_matters)) < 0 || (fp = GET(plan, fp)) == NULL ||
        (hash = GET(plan, fp_hash)) == NULL || (kind = PyLong_FromLong(k)) == NULL)
        goto out;
    out = PyTuple_Pack(PX_N, ok ? Py_True : Py_False, recipe, kind, persist,
                       broot ? Py_True : Py_False, fp, hash, regm ? Py_True : Py_False);
out:
    Py_XDECREF(recipe);
    Py_XDECREF(persist);
    Py_XDECREF(kindo);
    Py_XDECREF(fp);
    Py_XDECREF(hash);
    Py_XDECREF(kind);
    return out;
}

/* a communicator's state: its engine, lock, ledger, persistent sets, the engine's loose
 * tasks, whether its calls may start loose (st.fast and engine.early), and the ledger's
 * rings and sizes */
static PyObject *state_info(PyObject *st) {
    PyObject *engine = NULL, *lock = NULL, *ledger = NULL, *persist = NULL, *loose = NULL,
             *fps = NULL, *digests = NULL, *every = NULL, *window = NULL, *out = NULL;
    int ok;
    if ((engine = GET(st, engine)) == NULL || (lock = GET(st, lock)) == NULL ||
        (ledger = GET(st, ledger)) == NULL || (persist = GET(st, persist)) == NULL ||
        (loose = GET(engine, loose)) == NULL)
        goto out;
    if (!PyDict_Check(persist) || !PyDict_Check(loose)) {
        PyErr_SetString(PyExc_TypeError, "hpccoll express: the state is not as expected");
        goto out;
    }
    if ((ok = is_true(st, S_fast)) < 0)
        goto out;
    if (ok && (ok = is_true(engine, S_early)) < 0)
        goto out;
    if (ledger != Py_None) {
        if ((fps = GET(ledger, fps)) == NULL || (digests = GET(ledger, digests)) == NULL ||
            (every = GET(ledger, every)) == NULL || (window = GET(ledger, window)) == NULL)
            goto out;
        if (!PyList_Check(fps) || !PyList_Check(digests) ||
            PyList_GET_SIZE(fps) != PyLong_AsSsize_t(window) ||
            PyList_GET_SIZE(digests) != PyList_GET_SIZE(fps) || PyLong_AsLong(every) <= 0)
            ok = 0;                    /* not the ledger this was written for */
    } else {
        fps = Py_NewRef(Py_None);
        digests = Py_NewRef(Py_None);
        every = Py_NewRef(Py_None);
        window = Py_NewRef(Py_None);
    }
    if (PyErr_Occurred())
        goto out;
    out = PyTuple_Pack(SX_N, engine, lock, ledger, persist, loose, ok ? Py_True : Py_False,
                       fps, digests, every, window);
out:
    Py_XDECREF(engine);
    Py_XDECREF(lock);
    Py_XDECREF(ledger);
    Py_XDECREF(persist);
    Py_XDECREF(loose);
    Py_XDECREF(fps);
    Py_XDECREF(digests);
    Py_XDECREF(every);
    Py_XDECREF(window);
    return out;
}

/* the engine: its xlock, loose tasks and programs, queue, the waiter's spin_polls (at
 * least 1) and yield_polls, the flight recorder's ring (or None) */
static PyObject *engine_info(PyObject *engine) {
    PyObject *xlock = NULL, *loose = NULL, *programs = NULL, *sq = NULL, *settings = NULL,
             *flight = NULL, *ring = NULL, *polls = NULL, *yields = NULL, *out = NULL;
    if ((xlock = GET(engine, xlock)) == NULL || (loose = GET(engine, loose)) == NULL ||
        (programs = GET(engine, loose_programs)) == NULL || (sq = GET(engine, sq)) == NULL ||
        (settings = GET(engine, settings)) == NULL || (flight = GET(engine, flight)) == NULL)
        goto out;
    if (!PyDict_Check(loose) || !PyDict_Check(programs)) {
        PyErr_SetString(PyExc_TypeError, "hpccoll express: the engine is not as expected");
        goto out;
    }
    ring = flight == Py_None ? Py_NewRef(Py_None) : GET(flight, ring);
    long long p = as_ll(settings, S_spin_polls), y = as_ll(settings, S_yield_polls);
    if (ring == NULL || PyErr_Occurred() || (polls = PyLong_FromLongLong(p < 1 ? 1 : p)) == NULL ||
        (yields = PyLong_FromLongLong(y < 0 ? 0 : y)) == NULL)
        goto out;
    out = PyTuple_Pack(EX_N, xlock, loose, programs, sq, polls, yields, ring);
out:
    Py_XDECREF(xlock);
    Py_XDECREF(loose);
    Py_XDECREF(programs);
    Py_XDECREF(sq);
    Py_XDECREF(settings);
    Py_XDECREF(flight);
    Py_XDECREF(ring);
    Py_XDECREF(polls);
    Py_XDECREF(yields);
    return out;
}

#define AT(t, i) PyTuple_GET_ITEM((t), (i))

/* Ledger.record(seq, plan.fp, plan.fp_hash) */
static int record(PyObject *ledger, PyObject *scx, long long seq, PyObject *pcx,
                  PyObject *seqo) {
    long long h = PyLong_AsLongLong(AT(pcx, PX_HASH));
    long long window = PyLong_AsLongLong(AT(scx, SX_WINDOW));
    PyObject *prev = GET(ledger, digest);
    if (prev == NULL)
        return -1;
    uint64_t d0 = PyLong_AsUnsignedLongLong(prev);
    Py_DECREF(prev);
    if (PyErr_Occurred())
        return -1;
    uint64_t d = (d0 * MIX + (uint64_t)h + 1) & MASK;
    PyObject *dv = PyLong_FromUnsignedLongLong(d);
    if (dv == NULL)
        return -1;
    if (SET(ledger, digest, dv) < 0 || SET(ledger, seq, seqo) < 0) {
        Py_DECREF(dv);
        return -1;
    }
    Py_ssize_t i = (Py_ssize_t)(seq % window);
    PyList_SetItem(AT(scx, SX_FPS), i, Py_NewRef(AT(pcx, PX_FP)));
    PyList_SetItem(AT(scx, SX_DIGESTS), i, dv);      /* (steals dv) */
    return 0;
}

/* an instance with no __init__ run: the fields are set by the caller (object's own
 * tp_new, which also prepares the instance's dict) */
static PyObject *EMPTY;
static PyObject *new_instance(PyObject *type) {
    PyTypeObject *t = (PyTypeObject *)type;
    return t->tp_new(t, EMPTY, NULL);
}

/* MPI's nonblocking collective of recipe r on send/recv (lane.post, not in place, no avg) */
static PyObject *post(PyObject *r, int kind, PyObject *send, PyObject *recv) {
    PyObject *fn = GET(r, post), *out = NULL, *mop = NULL, *root = NULL;
    if (fn == NULL)
        return NULL;
    switch (kind) {
    case K_ALLREDUCE:
    case K_REDUCE_SCATTER:
        if ((mop = GET(r, mop)) != NULL)
            out = PyObject_CallFunctionObjArgs(fn, send, recv, mop, NULL);
        break;
    case K_REDUCE: {
        long long rank = as_ll(r, S_rank);
        if ((mop = GET(r, mop)) != NULL && (root = GET(r, root)) != NULL && !PyErr_Occurred())
            out = PyObject_CallFunctionObjArgs(fn, send, rank == PyLong_AsLongLong(root)
                                               ? recv : Py_None, mop, root, NULL);
        break;
    }
    case K_BROADCAST:
        if ((root = GET(r, root)) != NULL)
            out = PyObject_CallFunctionObjArgs(fn, recv, root, NULL);
        break;
    case K_BARRIER:
        out = PyObject_CallNoArgs(fn);
        break;
    default:
        out = PyObject_CallFunctionObjArgs(fn, send, recv, NULL);
    }
    Py_DECREF(fn);
    Py_XDECREF(mop);
    Py_XDECREF(root);
    return out;
}

static PyObject *issue(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "issue(state, call)");
        return NULL;
    }
    if (Task == NULL)
        Py_RETURN_NONE;
    PyObject *st = args[0], *call = args[1];
    PyObject *plan = NULL, *pcx = NULL, *scx = NULL, *send = NULL, *recv = NULL,
             *result = NULL, *pset = NULL, *slot = NULL, *req = NULL, *dst = NULL,
             *lane = NULL, *task = NULL, *now = NULL, *seqo = NULL, *out = Py_None,
             *exc = NULL;
    PyObject *recipe, *persist, *engine, *ledger, *lock;      /* borrowed from pcx, scx */
    Py_buffer bd, bs;
    int locked = 0, r, held = 0, kind;
    long long seq = 0, uses = 0;
    Py_INCREF(out);

    /* CommState._plan's lookup of the common signature (collective, dtype, count, op,
     * root, in place); a plan not made yet is the Python path's to make */
    {
        PyObject *v, *sig, *dt;
        if ((v = GET(call, device)) == NULL)
            goto fail;
        dt = GET(call, layout);
        r = v == Py_None && dt != NULL && PyObject_Not(dt) == 1;
        Py_DECREF(v);
        Py_XDECREF(dt);
        if (!r)
            goto fail_or_out;
        if ((send = GET(call, send)) == NULL || (sig = PyTuple_New(6)) == NULL)
            goto fail;
        PyObject *names[6] = {S_coll, NULL, S_count, S_op, S_root, S_inplace};
        for (int i = 0; i < 6; i++) {
            v = i == 1 ? GET(send, dtype) : PyObject_GetAttr(call, names[i]);
            if (v == NULL) {
                Py_DECREF(sig);
                goto fail;
            }
            PyTuple_SET_ITEM(sig, i, v);
        }
        PyObject *cache = GET(st, plans);
        if (cache == NULL) {
            Py_DECREF(sig);
            goto fail;
        }
        plan = PyDict_Check(cache) ? PyDict_GetItemWithError(cache, sig) : NULL;
        Py_XINCREF(plan);
        Py_DECREF(cache);
        Py_DECREF(sig);
        if (plan == NULL)
            goto fail_or_out;
    }
    if ((pcx = info(plan, plan_info)) == NULL)
        goto fail;
    if (AT(pcx, PX_OK) != Py_True)
        goto out;
    if (AT(pcx, PX_REGM) == Py_True) {
        /* registered buffers would change the plan: while registered memory exists,
         * the Python path looks at where these lie */
        PyObject *ctx = GET(st, ctx);
        if (ctx == NULL)
            goto fail;
        r = is_true(ctx, S__allocs);
        Py_DECREF(ctx);
        if (r != 0)
            goto check;
    }
    if ((scx = info(st, state_info)) == NULL)
        goto fail;
    if (AT(scx, SX_OK) != Py_True)
        goto out;
    recipe = AT(pcx, PX_RECIPE);
    persist = AT(pcx, PX_PERSIST);
    kind = (int)PyLong_AsLong(AT(pcx, PX_KIND));
    engine = AT(scx, SX_ENGINE);
    ledger = AT(scx, SX_LEDGER);
    lock = AT(scx, SX_LOCK);
    if ((recv = GET(call, recv)) == NULL || (result = GET(call, result)) == NULL)
        goto fail;

    if (call_lock(lock, S_acquire) < 0)
        goto fail;
    locked = 1;
    if ((seq = as_ll(st, S_seq)) < 0 && PyErr_Occurred())
        goto fail;
    if (ledger != Py_None) {
        long long every = PyLong_AsLongLong(AT(scx, SX_EVERY));
        if (seq % every == every - 1)   /* the digest check rides along */
            goto out;
    }
    if ((r = prev_started(st)) <= 0)
        goto check;
    if (persist != Py_None) {
        pset = PyDict_GetItemWithError(AT(scx, SX_PERSIST), persist);
        if (pset == NULL)
            goto fail_or_out;         /* made by the Python path, at its first call */
        Py_INCREF(pset);
        PyObject *slots = GET(pset, slots);
        if (slots == NULL)
            goto fail;
        uses = as_ll(pset, S_uses);
        if (PyErr_Occurred() || !PyTuple_Check(slots) || PyTuple_GET_SIZE(slots) != SLOTS) {
            Py_DECREF(slots);
            goto fail_or_out;
        }
        slot = Py_NewRef(PyTuple_GET_ITEM(slots, uses % SLOTS));
        Py_DECREF(slots);
        if ((r = is_true(slot, S_busy)) != 0)
            goto check;
        if ((req = GET(slot, req)) == NULL)
            goto fail;
        if (req == Py_None)
            goto out;                 /* initialised by the Python path, at its first start */
        /* what the input is copied into: the root's result for a broadcast, else the
         * staging input (none: a barrier, or a rank that only receives) */
        if (kind == K_BROADCAST)
            dst = AT(pcx, PX_BROOT) == Py_True ? GET(slot, recv) : Py_NewRef(Py_None);
        else
            dst = GET(slot, send);
        if (dst == NULL)
            goto fail;
        /* held until the copy below: the buffers cannot change meanwhile (a copy that
         * could not be made sends the call to the Python path, nothing changed) */
        if (dst != Py_None) {
            if (PyObject_GetBuffer(dst, &bd, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
                goto clear_out;
            held = 1;
            if (PyObject_GetBuffer(send, &bs, PyBUF_C_CONTIGUOUS) < 0)
                goto clear_out;
            held = 2;
            if (bd.len != bs.len)
                goto out;
        }
    }

    /* -- committed: from here on the call is this collective, as in CommState.issue.
     * MPI's collective first, the bookkeeping after it: the peers progress on this
     * rank's part meanwhile (an error MPI raises is the task's, made all the same) -- */
    PyObject *rq = NULL;
    if (slot != NULL) {
        if (held == 2 && bd.len)
            memcpy(bd.buf, bs.buf, (size_t)bd.len);
        if (SET(slot, busy, Py_True) < 0)
            goto fail;
        PyObject *res = PyObject_CallMethodNoArgs(req, S_Start);
        if (res == NULL)
            exc = take_exception();
        else {
            Py_DECREF(res);
            rq = Py_NewRef(req);
        }
    } else if ((rq = post(recipe, kind, send, recv)) == NULL) {
        exc = take_exception();
    }
    if (rq == NULL && exc == NULL)
        goto fail;
    if ((seqo = PyLong_FromLongLong(seq + 1)) == NULL || SET(st, seq, seqo) < 0)
        goto fail_rq;
    Py_SETREF(seqo, PyLong_FromLongLong(seq));
    if (seqo == NULL)
        goto fail_rq;
    if (pset != NULL) {
        PyObject *u = PyLong_FromLongLong(uses + 1);
        if (u == NULL || SET(pset, uses, u) < 0) {
            Py_XDECREF(u);
            goto fail_rq;
        }
        Py_DECREF(u);
    }
    if (ledger != Py_None && record(ledger, scx, seq, pcx, seqo) < 0)
        goto fail_rq;
    if ((lane = new_instance(MpiLane)) == NULL || SET(lane, recipe, recipe) < 0 ||
        SET(lane, send, send) < 0 || SET(lane, recv, recv) < 0 ||
        SET(lane, slot, slot ? slot : Py_None) < 0 ||
        SET(lane, req, rq ? rq : Py_None) < 0 || SET(lane, done, Py_False) < 0)
        goto fail_rq;
    Py_CLEAR(rq);
    if ((now = monotonic()) == NULL || (task = new_instance(Task)) == NULL)
        goto fail;
    if (SET(task, _engine, engine) < 0 || SET(task, comm, st) < 0 || SET(task, plan, plan) < 0 ||
        SET(task, seq, seqo) < 0 || SET(task, lane, lane) < 0 ||
        SET(task, result, result) < 0 ||
        SET(task, t_issue, now) < 0 || SET(task, last_progress, now) < 0 ||
        SET(task, t_start, now) < 0 || SET(task, state, RUNNING) < 0 ||
        SET(st, last, Py_None) < 0)
        goto fail;
    Py_CLEAR(out);
    out = Py_NewRef(task);
    if (exc != NULL)
        goto mpi_error;
    if (SET(task, posted, Py_True) < 0 || SET(task, loose, Py_True) < 0 ||
        PyDict_SetItem(AT(scx, SX_LOOSE), task, Py_None) < 0)
        goto fail;
    issued++;
    goto out;

fail_rq:
    Py_XDECREF(rq);
    goto fail;
mpi_error:
    /* CommState.issue's "MPI's error at post time": after the lock, the engine adopts it */
    failed_starts++;
    locked = 0;
    if (call_lock(lock, S_release) < 0)
        goto fail;
    {
        PyObject *res = PyObject_CallMethodObjArgs(st, S__express_failed, task, exc, NULL);
        if (res == NULL)
            goto fail;
        Py_DECREF(res);
    }
    goto out;
check:
    /* r: 1 stops the route, -1 is an error */
    if (r < 0)
        goto fail;
    goto out;
fail_or_out:
    if (PyErr_Occurred())
        goto fail;
    goto out;
clear_out:
    PyErr_Clear();
    goto out;
fail:
    Py_CLEAR(out);
out:
    if (held >= 2)
        PyBuffer_Release(&bs);
    if (held >= 1)
        PyBuffer_Release(&bd);
    if (locked) {
        PyObject *et = take_exception();
        if (call_lock(lock, S_release) < 0 && out != NULL)
            Py_CLEAR(out);
        if (et != NULL)
            restore_exception(et);
    }
    Py_XDECREF(plan);
    Py_XDECREF(pcx);
    Py_XDECREF(scx);
    Py_XDECREF(send);
    Py_XDECREF(recv);
    Py_XDECREF(result);
    Py_XDECREF(pset);
    Py_XDECREF(slot);
    Py_XDECREF(req);
    Py_XDECREF(dst);
    Py_XDECREF(lane);
    Py_XDECREF(task);
    Py_XDECREF(now);
    Py_XDECREF(seqo);
    Py_XDECREF(exc);
    return out;
}

/* Engine._done_loose's steps for an MPI lane (the xlock held): the result out of the
 * staging array (MpiLane.finish), the task done, out of the loose ones, recorded */
static int done_loose(PyObject *engine, PyObject *ecx, PyObject *task, PyObject *lane) {
    int rc = -1, finished = 0;
    PyObject *slot = NULL, *srecv = NULL, *recv = NULL, *plan = NULL, *pcx = NULL,
             *now = NULL, *row = NULL;
    if ((slot = GET(lane, slot)) == NULL || (plan = GET(task, plan)) == NULL ||
        (pcx = info(plan, plan_info)) == NULL)
        goto out;
    if (slot != Py_None) {
        if ((srecv = GET(slot, recv)) == NULL || (recv = GET(lane, recv)) == NULL)
            goto out;
        /* (a broadcast's root has its result in place) */
        if (srecv != Py_None && recv != Py_None && AT(pcx, PX_BROOT) != Py_True &&
            copy_into(recv, srecv) < 0) {
            /* not a plain buffer pair: the Python lane does it */
            PyObject *res = PyObject_CallMethod(lane, "finish", NULL);
            if (res == NULL)
                goto out;
            Py_DECREF(res);
            finished = 1;
        }
        if (!finished && SET(slot, busy, Py_False) < 0)
            goto out;
    }
    if (SET(lane, done, Py_True) < 0 || SET(task, state, DONE) < 0 ||
        (now = monotonic()) == NULL || SET(task, t_end, now) < 0 ||
        SET(engine, app_active, now) < 0)
        goto out;
    if (PyDict_DelItem(AT(ecx, EX_LOOSE), task) < 0)
        goto out;
    PyObject *programs = AT(ecx, EX_PROGRAMS);
    if (PyDict_GET_SIZE(programs) && PyDict_DelItem(programs, task) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            goto out;
        PyErr_Clear();
    }
    if (SET(task, loose, Py_False) < 0 || SET(task, retired, Py_True) < 0)
        goto out;
    PyObject *ring = AT(ecx, EX_RING);
    if (ring != Py_None) {   /* flight.Recorder.append's row */
        PyObject *names[4] = {S_comm, S_seq, S_key, S_t_start};
        PyObject *got[4] = {NULL, NULL, NULL, NULL};
        PyObject *t_issue = NULL;
        int ok = 1;
        for (int i = 0; i < 4 && ok; i++)
            ok = (got[i] = PyObject_GetAttr(task, names[i])) != NULL;
        ok = ok && (t_issue = GET(task, t_issue)) != NULL;
        if (ok)
            row = PyTuple_Pack(8, got[0], got[1], got[2], plan, DONE, t_issue, got[3], now);
        for (int i = 0; i < 4; i++)
            Py_XDECREF(got[i]);
        Py_XDECREF(t_issue);
        if (row == NULL)
            goto out;
        PyObject *res = PyObject_CallMethodOneArg(ring, S_append, row);
        if (res == NULL)
            goto out;
        Py_DECREF(res);
    }
    if (SET(lane, send, Py_None) < 0 || SET(lane, recv, Py_None) < 0 ||
        SET(task, _done, Py_True) < 0)
        goto out;
    rc = 0;
out:
    Py_XDECREF(slot);
    Py_XDECREF(srecv);
    Py_XDECREF(recv);
    Py_XDECREF(plan);
    Py_XDECREF(pcx);
    Py_XDECREF(now);
    Py_XDECREF(row);
    return rc;
}

static PyObject *wait(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait(task, timeout)");
        return NULL;
    }
    PyObject *task = args[0], *timeout = args[1];
    PyObject *engine = NULL, *ecx = NULL, *xlock = NULL, *v = NULL, *lane = NULL,
             *req = NULL, *exc = NULL;
    int locked = 0, done = 0, failed = 0, r;
    if (Task == NULL)
        Py_RETURN_FALSE;
    /* a task's lane and check never change: a program, or a check riding along, is the
     * Python waiter's before any lock is taken */
    if ((v = GET(task, check)) == NULL)
        goto fail;
    if (v != Py_None)
        goto out;
    if ((lane = GET(task, lane)) == NULL)
        goto fail;
    if ((PyObject *)Py_TYPE(lane) != MpiLane)
        goto out;
    if ((engine = GET(task, _engine)) == NULL || (ecx = info(engine, engine_info)) == NULL)
        goto fail;
    xlock = AT(ecx, EX_XLOCK);
    if (call_lock(xlock, S_acquire) < 0)
        goto fail;
    locked = 1;
    if ((r = is_true(task, S_loose)) <= 0)
        goto check;
    /* the engine has work of its own (the Python waiter drives it), or a program is
     * loose besides this (the waiter steps them all) */
    if ((r = is_true(engine, S__live)) != 0)
        goto check;
    Py_ssize_t queued = PyObject_Length(AT(ecx, EX_SQ));
    if (queued != 0)
        goto fail_or_out;
    if (PyDict_GET_SIZE(AT(ecx, EX_LOOSE)) > 1 && PyDict_GET_SIZE(AT(ecx, EX_PROGRAMS)) != 0)
        goto out;
    if ((req = GET(lane, req)) == NULL)
        goto fail;
    if (req == Py_None)
        goto out;
    long long polls = PyLong_AsLongLong(AT(ecx, EX_POLLS));
    /* where ranks outnumber cores (yield_polls set, spinning off), the Python waiter
     * hands its CPU over between polls: the peer this waits for is likely ready to run
     * on this core */
    long long yields = timeout == Py_None ? PyLong_AsLongLong(AT(ecx, EX_YIELDS)) : 0;
    for (long long i = 0; i < polls + yields; i++) {
        if (i >= polls) {
            Py_BEGIN_ALLOW_THREADS
            sched_yield();
            Py_END_ALLOW_THREADS
        }
        PyObject *res = PyObject_CallMethodNoArgs(req, S_Test);
        if (res == NULL) {       /* MPI's error: the engine explains it */
            exc = take_exception();
            PyObject *a = PyTuple_Pack(1, task), *kw = Py_BuildValue("{OO}", S_poll_error, exc);
            PyObject *fn = GET(engine, _adopt_loose);
            PyObject *res2 = (a && kw && fn) ? PyObject_Call(fn, a, kw) : NULL;
            Py_XDECREF(a);
            Py_XDECREF(kw);
            Py_XDECREF(fn);
            if (res2 == NULL)
                goto fail;
            Py_DECREF(res2);
            goto out;
        }
        int t = res == Py_True;
        Py_DECREF(res);
        if (t) {
            if (done_loose(engine, ecx, task, lane) < 0)
                goto fail;
            completed++;
            done = 1;
            break;
        }
    }
    goto out;
check:
    if (r < 0)
        goto fail;
    goto out;
fail_or_out:
    if (PyErr_Occurred())
        goto fail;
    goto out;
fail:
    failed = 1;
out:
    if (locked) {
        PyObject *et = take_exception();
        if (call_lock(xlock, S_release) < 0)
            failed = 1;
        if (et != NULL)
            restore_exception(et);
    }
    Py_XDECREF(engine);
    Py_XDECREF(ecx);
    Py_XDECREF(v);
    Py_XDECREF(lane);
    Py_XDECREF(req);
    Py_XDECREF(exc);
    if (failed)
        return NULL;
    return PyBool_FromLong(done);
}

static PyObject *counts(PyObject *m, PyObject *unused) {
    return Py_BuildValue("(LLL)", issued, completed, failed_starts);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(Task, MpiLane, RUNNING, DONE, FAILED, slots): what the calls make"},
    {"issue", (PyCFunction)(void (*)(void))issue, METH_FASTCALL,
     "issue(state, call) -> Task or None: CommState.issue's loose route"},
    {"wait", (PyCFunction)(void (*)(void))wait, METH_FASTCALL,
     "wait(task, timeout) -> bool: a loose MPI task's first spin and completion"},
    {"counts", counts, METH_NOARGS, "(issued, completed, failed at start) by this module, in this process"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "hpccoll.core._express",
                                    "the per-call path of MPI-run collectives, in C", -1,
                                    methods};

PyMODINIT_FUNC PyInit__express(void) {
#define INTERN(n)                                                                       \
    if ((S_##n = PyUnicode_InternFromString(#n)) == NULL)                               \
        return NULL;
    NAMES(INTERN)
    if ((EMPTY = PyTuple_New(0)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
