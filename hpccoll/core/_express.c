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

static PyObject *Task, *MpiLane, *RUNNING, *DONE, *FAILED, *IN_PLACE;
static long long SLOTS = 16;
static const uint64_t MASK = (1ULL << 62) - 1, MIX = 1000003ULL;
static long long issued, completed;   /* for tests: that this path runs */

#define NAMES(X)                                                                        \
    X(recipe) X(early) X(fast) X(engine) X(divisor) X(persist) X(kind) X(inplace)       \
    X(send) X(recv) X(result) X(ledger) X(lock) X(seq) X(every) X(last) X(posted)       \
    X(state) X(slots) X(uses) X(busy) X(req) X(root) X(rank) X(digest) X(fp) X(fp_hash) \
    X(window) X(fps) X(digests) X(slot) X(done) X(_engine) X(comm) X(plan) X(key)       \
    X(lane) X(check) X(prev) X(gated) X(t_issue) X(last_progress) X(t_start) X(loose)   \
    X(acquire) X(release) X(Start) X(Test) X(post) X(mop) X(xlock) X(_live) X(sq)       \
    X(loose_programs) X(settings) X(spin_polls) X(t_end) X(app_active) X(retired)       \
    X(flight) X(ring) X(append) X(_done) X(_adopt_loose) X(poll_error) \
    X(_express_failed) X(plans) \
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
    PyObject *task, *lane, *running, *done, *failed, *in_place;
    long long slots;
    if (!PyArg_ParseTuple(args, "OOOOOOL", &task, &lane, &running, &done, &failed,
                          &in_place, &slots))
        return NULL;
    Py_XSETREF(Task, Py_NewRef(task));
    Py_XSETREF(MpiLane, Py_NewRef(lane));
    Py_XSETREF(RUNNING, Py_NewRef(running));
    Py_XSETREF(DONE, Py_NewRef(done));
    Py_XSETREF(FAILED, Py_NewRef(failed));
    Py_XSETREF(IN_PLACE, Py_NewRef(in_place));
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

/* Ledger.record(seq, plan.fp, plan.fp_hash) */
static int record(PyObject *ledger, long long seq, PyObject *plan) {
    int rc = -1;
    PyObject *fp = NULL, *fps = NULL, *digests = NULL, *dv = NULL, *sv = NULL;
    long long h = as_ll(plan, S_fp_hash);
    long long prev = as_ll(ledger, S_digest);
    long long window = as_ll(ledger, S_window);
    if (PyErr_Occurred() || window <= 0)
        goto out;
    uint64_t d = ((uint64_t)prev * MIX + (uint64_t)h + 1) & MASK;
    if ((fp = GET(plan, fp)) == NULL || (fps = GET(ledger, fps)) == NULL ||
        (digests = GET(ledger, digests)) == NULL || !PyList_Check(fps) ||
        !PyList_Check(digests) || PyList_GET_SIZE(fps) != window ||
        PyList_GET_SIZE(digests) != window)
        goto out;
    if ((dv = PyLong_FromUnsignedLongLong(d)) == NULL || (sv = PyLong_FromLongLong(seq)) == NULL)
        goto out;
    if (SET(ledger, digest, dv) < 0 || SET(ledger, seq, sv) < 0)
        goto out;
    Py_ssize_t i = (Py_ssize_t)(seq % window);
    PyList_SetItem(fps, i, Py_NewRef(fp));
    PyList_SetItem(digests, i, Py_NewRef(dv));
    rc = 0;
out:
    if (rc < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "hpccoll express: the ledger is not as expected");
    Py_XDECREF(fp);
    Py_XDECREF(fps);
    Py_XDECREF(digests);
    Py_XDECREF(dv);
    Py_XDECREF(sv);
    return rc;
}

/* an instance with no __init__ run: the fields are set by the caller (object's own
 * tp_new, which also prepares the instance's dict) */
static PyObject *EMPTY;
static PyObject *new_instance(PyObject *type) {
    PyTypeObject *t = (PyTypeObject *)type;
    return t->tp_new(t, EMPTY, NULL);
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
    PyObject *st = args[0], *call = args[1], *plan = NULL;
    PyObject *recipe = NULL, *engine = NULL, *persist = NULL, *kindo = NULL, *send = NULL,
             *recv = NULL, *result = NULL, *ledger = NULL, *lock = NULL, *pset = NULL,
             *slot = NULL, *req = NULL, *dst = NULL, *lane = NULL, *task = NULL,
             *now = NULL, *seqo = NULL, *out = Py_None, *loose = NULL, *exc = NULL;
    Py_buffer bd, bs;
    int locked = 0, r, held = 0;
    long long seq = 0, uses = 0;
    Py_INCREF(out);

    /* CommState._plan's lookup of the common signature (collective, dtype, count, op,
     * root, in place); a plan not made yet, or one that registered buffers could change
     * while registered memory exists, is the Python path's */
    {
        PyObject *v, *sig = PyTuple_New(6), *dt;
        if (sig == NULL)
            goto fail;
        if ((v = GET(call, device)) == NULL || (dt = GET(call, layout)) == NULL) {
            Py_XDECREF(v);
            Py_DECREF(sig);
            goto fail;
        }
        r = v == Py_None && dt != NULL && PyObject_Not(dt) == 1;
        Py_DECREF(v);
        Py_DECREF(dt);
        if (!r) {
            Py_DECREF(sig);
            goto fail_or_out;
        }
        PyObject *names[6] = {S_coll, NULL, S_count, S_op, S_root, S_inplace};
        for (int i = 0; i < 6; i++) {
            if (i == 1) {
                PyObject *s = GET(call, send);
                v = s == NULL ? NULL : GET(s, dtype);
                Py_XDECREF(s);
            } else {
                v = PyObject_GetAttr(call, names[i]);
            }
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
        if ((r = is_true(plan, S_reg_matters)) != 0) {
            if (r < 0)
                goto fail;
            PyObject *ctx = GET(st, ctx);
            if (ctx == NULL)
                goto fail;
            r = is_true(ctx, S__allocs);
            Py_DECREF(ctx);
            if (r != 0)
                goto check_inv;
        }
    }
    if ((recipe = GET(plan, recipe)) == NULL)
        goto fail;
    if (recipe == Py_None)
        goto out;
    if ((r = is_true(plan, S_early)) <= 0 || (r = is_true(st, S_fast)) <= 0)
        goto check;
    if ((engine = GET(st, engine)) == NULL)
        goto fail;
    if ((r = is_true(engine, S_early)) <= 0 || (r = is_true(recipe, S_divisor)) != 0)
        goto check_inv;
    if ((persist = GET(recipe, persist)) == NULL || (kindo = GET(recipe, kind)) == NULL)
        goto fail;
    int kind = kind_of(kindo);
    if (kind == K_OTHER)
        goto out;
    if (persist == Py_None && kind != K_BROADCAST && kind != K_BARRIER) {
        if ((r = is_true(recipe, S_inplace)) != 0)
            goto check_inv;
    }
    if ((send = GET(call, send)) == NULL || (recv = GET(call, recv)) == NULL ||
        (result = GET(call, result)) == NULL || (ledger = GET(st, ledger)) == NULL ||
        (lock = GET(st, lock)) == NULL)
        goto fail;

    if (call_lock(lock, S_acquire) < 0)
        goto fail;
    locked = 1;
    if ((seq = as_ll(st, S_seq)) < 0 && PyErr_Occurred())
        goto fail;
    if (ledger != Py_None) {
        long long every = as_ll(ledger, S_every);
        if (PyErr_Occurred())
            goto fail;
        if (every <= 0 || seq % every == every - 1)   /* the digest check rides along */
            goto out;
    }
    if ((r = prev_started(st)) <= 0)
        goto check;
    if (persist != Py_None) {
        PyObject *map = GET(st, persist);
        if (map == NULL)
            goto fail;
        pset = PyDict_GetItemWithError(map, persist);
        Py_XINCREF(pset);
        Py_DECREF(map);
        if (pset == NULL) {
            if (PyErr_Occurred())
                goto fail;
            goto out;                 /* made by the Python path, at its first call */
        }
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
            goto check_inv;
        if ((req = GET(slot, req)) == NULL)
            goto fail;
        if (req == Py_None)
            goto out;                 /* initialised by the Python path, at its first start */
        /* what the input is copied into: the root's result for a broadcast, else the
         * staging input (none: a barrier, or a rank that only receives) */
        if (kind == K_BROADCAST) {
            long long rank = as_ll(recipe, S_rank), root = as_ll(recipe, S_root);
            if (PyErr_Occurred())
                goto fail;
            dst = rank == root ? GET(slot, recv) : Py_NewRef(Py_None);
        } else {
            dst = GET(slot, send);
        }
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

    /* -- committed: from here on the call is this collective, as in CommState.issue -- */
    if ((seqo = PyLong_FromLongLong(seq + 1)) == NULL || SET(st, seq, seqo) < 0)
        goto fail;
    Py_SETREF(seqo, PyLong_FromLongLong(seq));
    if (seqo == NULL)
        goto fail;
    if (pset != NULL) {
        PyObject *u = PyLong_FromLongLong(uses + 1);
        if (u == NULL || SET(pset, uses, u) < 0) {
            Py_XDECREF(u);
            goto fail;
        }
        Py_DECREF(u);
    }
    if (ledger != Py_None && record(ledger, seq, plan) < 0)
        goto fail;
    if ((lane = new_instance(MpiLane)) == NULL || SET(lane, recipe, recipe) < 0 ||
        SET(lane, send, send) < 0 || SET(lane, recv, recv) < 0 ||
        SET(lane, slot, slot ? slot : Py_None) < 0 || SET(lane, req, Py_None) < 0 ||
        SET(lane, done, Py_False) < 0)
        goto fail;
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
    /* MPI's collective: an error here is the task's (the engine adopts it with it) */
    if (slot != NULL) {
        if (held == 2 && bd.len)
            memcpy(bd.buf, bs.buf, (size_t)bd.len);
        if (SET(slot, busy, Py_True) < 0)
            goto fail;
        PyObject *res = PyObject_CallMethodNoArgs(req, S_Start);
        if (res == NULL)
            goto mpi_error;
        Py_DECREF(res);
        if (SET(lane, req, req) < 0)
            goto fail;
    } else {
        PyObject *rq = post(recipe, kind, send, recv);
        if (rq == NULL)
            goto mpi_error;
        r = SET(lane, req, rq);
        Py_DECREF(rq);
        if (r < 0)
            goto fail;
    }
    if (SET(task, posted, Py_True) < 0 || SET(task, loose, Py_True) < 0 ||
        (loose = GET(engine, loose)) == NULL || PyDict_SetItem(loose, task, Py_None) < 0)
        goto fail;
    issued++;
    goto out;

mpi_error:
    /* CommState.issue's "MPI's error at post time": after the lock, the engine adopts it */
    exc = take_exception();
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
check_inv:
    /* r: 1 (or an error) stops the route */
    if (r < 0)
        goto fail;
    goto out;
check:
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
    Py_XDECREF(recipe);
    Py_XDECREF(engine);
    Py_XDECREF(persist);
    Py_XDECREF(kindo);
    Py_XDECREF(send);
    Py_XDECREF(recv);
    Py_XDECREF(result);
    Py_XDECREF(ledger);
    Py_XDECREF(lock);
    Py_XDECREF(pset);
    Py_XDECREF(slot);
    Py_XDECREF(req);
    Py_XDECREF(dst);
    Py_XDECREF(lane);
    Py_XDECREF(task);
    Py_XDECREF(now);
    Py_XDECREF(seqo);
    Py_XDECREF(loose);
    Py_XDECREF(exc);
    return out;
}

/* Engine._done_loose's steps for an MPI lane (the xlock held): the result out of the
 * staging array (MpiLane.finish), the task done, out of the loose ones, recorded */
static int done_loose(PyObject *engine, PyObject *task, PyObject *lane) {
    int rc = -1, finished = 0;
    PyObject *slot = NULL, *srecv = NULL, *recv = NULL, *recipe = NULL, *now = NULL,
             *loose = NULL, *programs = NULL, *flight = NULL, *row = NULL, *ring = NULL;
    if ((slot = GET(lane, slot)) == NULL)
        goto out;
    if (slot != Py_None) {
        if ((srecv = GET(slot, recv)) == NULL || (recv = GET(lane, recv)) == NULL ||
            (recipe = GET(lane, recipe)) == NULL)
            goto out;
        if (srecv != Py_None && recv != Py_None) {
            PyObject *kind = GET(recipe, kind);
            if (kind == NULL)
                goto out;
            int bcast = kind_of(kind) == K_BROADCAST;
            Py_DECREF(kind);
            long long rank = bcast ? as_ll(recipe, S_rank) : 0;
            long long root = bcast ? as_ll(recipe, S_root) : 1;
            if (PyErr_Occurred())
                goto out;
            if (rank != root && copy_into(recv, srecv) < 0) {
                /* not a plain buffer pair: the Python lane does it */
                PyObject *res = PyObject_CallMethod(lane, "finish", NULL);
                if (res == NULL)
                    goto out;
                Py_DECREF(res);
                finished = 1;
            }
        }
        if (!finished && SET(slot, busy, Py_False) < 0)
            goto out;
    }
    if (SET(lane, done, Py_True) < 0 || SET(task, state, DONE) < 0 ||
        (now = monotonic()) == NULL || SET(task, t_end, now) < 0 ||
        SET(engine, app_active, now) < 0)
        goto out;
    if ((loose = GET(engine, loose)) == NULL || PyDict_DelItem(loose, task) < 0)
        goto out;
    if ((programs = GET(engine, loose_programs)) == NULL)
        goto out;
    if (PyDict_Check(programs) && PyDict_GET_SIZE(programs) &&
        PyDict_DelItem(programs, task) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            goto out;
        PyErr_Clear();
    }
    if (SET(task, loose, Py_False) < 0 || SET(task, retired, Py_True) < 0)
        goto out;
    if ((flight = GET(engine, flight)) == NULL)
        goto out;
    if (flight != Py_None) {   /* flight.Recorder.append */
        PyObject *names[8] = {S_comm, S_seq, S_key, S_plan, S_state, S_t_issue, S_t_start,
                              S_t_end};
        if ((row = PyTuple_New(8)) == NULL)
            goto out;
        for (int i = 0; i < 8; i++) {
            PyObject *v = PyObject_GetAttr(task, names[i]);
            if (v == NULL)
                goto out;
            PyTuple_SET_ITEM(row, i, v);
        }
        if ((ring = GET(flight, ring)) == NULL)
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
    Py_XDECREF(recipe);
    Py_XDECREF(now);
    Py_XDECREF(loose);
    Py_XDECREF(programs);
    Py_XDECREF(flight);
    Py_XDECREF(row);
    Py_XDECREF(ring);
    return rc;
}

static PyObject *wait(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait(task, timeout)");
        return NULL;
    }
    PyObject *task = args[0], *timeout = args[1];
    PyObject *engine = NULL, *xlock = NULL, *v = NULL, *lane = NULL, *req = NULL,
             *test = NULL, *settings = NULL, *exc = NULL;
    int locked = 0, done = 0, failed = 0;
    if (Task == NULL)
        Py_RETURN_FALSE;
    if ((engine = GET(task, _engine)) == NULL || (xlock = GET(engine, xlock)) == NULL ||
        call_lock(xlock, S_acquire) < 0)
        goto fail;
    locked = 1;
    int r = is_true(task, S_loose);
    if (r <= 0)
        goto check;
    /* the engine has work of its own (the Python waiter drives it), or a program is
     * loose besides this (the waiter steps them all) */
    if ((r = is_true(engine, S__live)) != 0)
        goto check;
    if ((v = GET(engine, sq)) == NULL)
        goto fail;
    Py_ssize_t queued = PyObject_Length(v);
    Py_CLEAR(v);
    if (queued != 0)
        goto fail_or_out;
    if ((v = GET(task, check)) == NULL)
        goto fail;
    if (v != Py_None)
        goto out;
    Py_CLEAR(v);
    if ((lane = GET(task, lane)) == NULL)
        goto fail;
    if ((PyObject *)Py_TYPE(lane) != MpiLane)
        goto out;
    if ((v = GET(engine, loose)) == NULL)
        goto fail;
    Py_ssize_t nloose = PyObject_Length(v);
    Py_CLEAR(v);
    if (nloose > 1) {
        if ((v = GET(engine, loose_programs)) == NULL)
            goto fail;
        Py_ssize_t np = PyObject_Length(v);
        Py_CLEAR(v);
        if (np != 0)
            goto fail_or_out;
    }
    if ((req = GET(lane, req)) == NULL)
        goto fail;
    if (req == Py_None)
        goto out;
    if ((settings = GET(engine, settings)) == NULL)
        goto fail;
    long long polls = as_ll(settings, S_spin_polls);
    if (PyErr_Occurred())
        goto fail;
    if (polls < 1)
        polls = 1;
    /* where ranks outnumber cores (yield_polls set, spinning off), the Python waiter
     * hands its CPU over between polls: the peer this waits for is likely ready to run
     * on this core */
    long long yields = timeout == Py_None ? as_ll(settings, S_yield_polls) : 0;
    if (PyErr_Occurred())
        goto fail;
    for (long long i = 0; i < polls + (yields > 0 ? yields : 0); i++) {
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
            if (done_loose(engine, task, lane) < 0)
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
    Py_XDECREF(xlock);
    Py_XDECREF(v);
    Py_XDECREF(lane);
    Py_XDECREF(req);
    Py_XDECREF(test);
    Py_XDECREF(settings);
    Py_XDECREF(exc);
    if (failed)
        return NULL;
    return PyBool_FromLong(done);
}

static PyObject *counts(PyObject *m, PyObject *unused) {
    return Py_BuildValue("(LL)", issued, completed);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(Task, MpiLane, RUNNING, DONE, FAILED, IN_PLACE, slots): what the calls make"},
    {"issue", (PyCFunction)(void (*)(void))issue, METH_FASTCALL,
     "issue(state, call) -> Task or None: CommState.issue's loose route"},
    {"wait", (PyCFunction)(void (*)(void))wait, METH_FASTCALL,
     "wait(task, timeout) -> bool: a loose MPI task's first spin and completion"},
    {"counts", counts, METH_NOARGS, "(issued, completed) by this module, in this process"},
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
