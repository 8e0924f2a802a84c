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
/* the shared-memory programs' route (bind_programs): engine/lane.py's ProgramLane and
 * HostOps, core/plan.py's empty scratch array, engine/_native.c's run */
static PyObject *ProgramLane, *HostOps, *NO_SCRATCH, *native_run;
static long long SLOTS = 16;
static const uint64_t MASK = (1ULL << 62) - 1, MIX = 1000003ULL;
static long long issued, completed, failed_starts;   /* for tests: that this path runs */
static long long p_issued, p_completed;               /* (the programs' route) */

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
    X(yield_polls) X(device) X(layout) X(coll) X(count) X(op) X(dtype) X(reg_matters) X(ctx) X(_allocs) \
    X(rt) X(native) X(code) X(program) X(epochs) X(scratch) X(shared) X(ops) X(detour)  \
    X(shm) X(area) X(epoch) X(gate) X(held) X(capacity) X(solo) X(holds) X(pc)         \
    X(waits_done) X(waiting) X(bufs) X(_bytes) X(itemsize) X(mpi) X(tag) X(inflight)    \
    X(base) X(pool) X(_pooled) X(bytes_moved) X(polls) X(data) X(tag_space) X(prev)      \
    X(release_lane) X(steps)
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

static PyObject *bind_programs(PyObject *m, PyObject *args) {
    PyObject *lane, *ops, *scratch, *run;
    if (!PyArg_ParseTuple(args, "OOOO", &lane, &ops, &scratch, &run))
        return NULL;
    Py_XSETREF(ProgramLane, Py_NewRef(lane));
    Py_XSETREF(HostOps, Py_NewRef(ops));
    Py_XSETREF(NO_SCRATCH, Py_NewRef(scratch));
    Py_XSETREF(native_run, Py_NewRef(run));
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
enum { PX_OK, PX_RECIPE, PX_KIND, PX_PERSIST, PX_BROOT, PX_FP, PX_HASH, PX_REGM,
       PX_PROG, PX_PROGRAM, PX_OP, PX_ITEMSIZE, PX_EPOCHS, PX_NSTEPS, PX_N };
enum { SX_ENGINE, SX_LOCK, SX_LEDGER, SX_PERSIST, SX_LOOSE, SX_OK, SX_FPS, SX_DIGESTS,
       SX_EVERY, SX_WINDOW, SX_SOLO, SX_DATA, SX_TAGSPACE, SX_SHM, SX_PROGRAMS, SX_N };
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

/* 1 if a plan with no recipe runs a node-shared-memory program on host arrays
 * (core/plan.py, Plan.lane's last case), 0 if not, -1 on error */
static int program_plan(PyObject *plan) {
    PyObject *v;
    int r;
    if ((v = GET(plan, detour)) == NULL)
        return -1;
    r = v == Py_None;
    Py_DECREF(v);
    if (r && (r = is_true(plan, S_device)) >= 0)
        r = !r;
    if (r > 0)
        r = is_true(plan, S_shared);
    if (r > 0) {
        if ((v = GET(plan, ops)) == NULL)
            return -1;
        r = v == HostOps;
        Py_DECREF(v);
    }
    return r;
}

/* a plan: whether the C route applies to it at all (MPI's own collective, started at
 * issue, no avg, a kind it knows, in place only through a persistent request's copy),
 * then the recipe, kind, persistent set key, whether this rank is a broadcast's root,
 * the fingerprint and its hash, reg_matters; then whether the programs' route applies
 * (a node-shared-memory program on host arrays that needs no scratch), and its program,
 * op, item size, epochs and number of steps */
static PyObject *plan_info(PyObject *plan) {
    PyObject *recipe = NULL, *persist = NULL, *kindo = NULL, *fp = NULL, *hash = NULL,
             *kind = NULL, *out = NULL, *program = NULL, *op = NULL, *itemsize = NULL,
             *epochs = NULL, *nsteps = NULL;
    int ok, broot = 0, k = K_OTHER, regm, prog = 0;
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
        if (ProgramLane != NULL && (prog = program_plan(plan)) < 0)
            goto out;
    }
    if (prog) {
        PyObject *dt = NULL, *steps = NULL;
        long long sc = -1;
        if ((program = GET(plan, program)) == NULL || (op = GET(plan, op)) == NULL ||
            (epochs = GET(program, epochs)) == NULL || (steps = GET(program, steps)) == NULL ||
            (dt = GET(plan, dtype)) == NULL || (itemsize = GET(dt, itemsize)) == NULL ||
            ((sc = as_ll(program, S_scratch)) < 0 && PyErr_Occurred())) {
            Py_XDECREF(dt);
            Py_XDECREF(steps);
            goto out;
        }
        Py_DECREF(dt);
        Py_ssize_t n = PyObject_Length(steps);
        Py_DECREF(steps);
        if (n < 0 || (nsteps = PyLong_FromSsize_t(n)) == NULL)
            goto out;
        prog = sc == 0 && PyLong_Check(epochs) && PyLong_Check(itemsize);
    }
    if ((regm = is_true(plan, S_reg_matters)) < 0 || (fp = GET(plan, fp)) == NULL ||
        (hash = GET(plan, fp_hash)) == NULL || (kind = PyLong_FromLong(k)) == NULL)
        goto out;
#define OR_NONE(o) ((o) != NULL ? (o) : Py_None)
    out = PyTuple_Pack(PX_N, ok ? Py_True : Py_False, recipe, kind, persist,
                       broot ? Py_True : Py_False, fp, hash, regm ? Py_True : Py_False,
                       prog ? Py_True : Py_False, OR_NONE(program), OR_NONE(op),
                       OR_NONE(itemsize), OR_NONE(epochs), OR_NONE(nsteps));
out:
    Py_XDECREF(program);
    Py_XDECREF(op);
    Py_XDECREF(itemsize);
    Py_XDECREF(epochs);
    Py_XDECREF(nsteps);
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
             *fps = NULL, *digests = NULL, *every = NULL, *window = NULL, *out = NULL,
             *solo = NULL, *data = NULL, *tags = NULL, *shm = NULL, *programs = NULL;
    int ok;
    if ((engine = GET(st, engine)) == NULL || (lock = GET(st, lock)) == NULL ||
        (ledger = GET(st, ledger)) == NULL || (persist = GET(st, persist)) == NULL ||
        (loose = GET(engine, loose)) == NULL || (solo = GET(engine, solo)) == NULL ||
        (data = GET(st, data)) == NULL || (tags = GET(st, tag_space)) == NULL ||
        (shm = GET(st, shm)) == NULL || (programs = GET(engine, loose_programs)) == NULL)
        goto out;
    if (!PyDict_Check(persist) || !PyDict_Check(loose) || !PyDict_Check(programs) ||
        !PyLong_Check(tags) || (shm != Py_None && !PyDict_Check(shm))) {
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
                       fps, digests, every, window, PyObject_IsTrue(solo) ? Py_True : Py_False,
                       data, tags, shm, programs);
out:
    Py_XDECREF(solo);
    Py_XDECREF(data);
    Py_XDECREF(tags);
    Py_XDECREF(shm);
    Py_XDECREF(programs);
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

/* 1 if the collective with sequence number seq carries the digest check (every
 * ledger.every-th: the Python path takes it), 0 if not */
static int digest_due(PyObject *scx, long long seq) {
    if (AT(scx, SX_LEDGER) == Py_None)
        return 0;
    long long every = PyLong_AsLongLong(AT(scx, SX_EVERY));
    return seq % every == every - 1;
}

/* the collective takes sequence number seq: the state's next one moves on and the ledger
 * records it (Ledger.record); seq as a Python int (a new reference), or NULL */
static PyObject *take_seq(PyObject *st, PyObject *scx, PyObject *pcx, long long seq) {
    PyObject *seqo = PyLong_FromLongLong(seq + 1), *ledger = AT(scx, SX_LEDGER);
    if (seqo == NULL || SET(st, seq, seqo) < 0) {
        Py_XDECREF(seqo);
        return NULL;
    }
    Py_SETREF(seqo, PyLong_FromLongLong(seq));
    if (seqo != NULL && ledger != Py_None && record(ledger, scx, seq, pcx, seqo) < 0)
        Py_CLEAR(seqo);
    return seqo;
}

/* release lock, keeping whatever exception is raised meanwhile; -1 if releasing failed */
static int release_keeping_error(PyObject *lock) {
    PyObject *et = take_exception();
    int rc = call_lock(lock, S_release);
    if (et != NULL)
        restore_exception(et);
    return rc;
}

/* the communicator's lock let go, CommState._express_failed(task, exc[, True]): the
 * engine adopts a task whose start (or, ``program``, its program's first run) raised exc */
static int hand_failure(PyObject *st, PyObject *lock, PyObject *task, PyObject *exc,
                        int program) {
    if (call_lock(lock, S_release) < 0)
        return -1;
    /* (NULL ends the arguments: without ``program`` the call takes two) */
    PyObject *res = PyObject_CallMethodObjArgs(st, S__express_failed, task, exc,
                                               program ? Py_True : NULL, NULL);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* an instance with no __init__ run: the fields are set by the caller (object's own
 * tp_new, which also prepares the instance's dict) */
static PyObject *EMPTY;
static PyObject *new_instance(PyObject *type) {
    PyTypeObject *t = (PyTypeObject *)type;
    return t->tp_new(t, EMPTY, NULL);
}

/* a started task of st (Task.__init__ and Task.start's fields; the others are the
 * class's defaults), the state's last task cleared (it started); NULL on error */
static PyObject *make_task(PyObject *engine, PyObject *st, PyObject *plan, PyObject *seqo,
                           PyObject *lane, PyObject *result, PyObject *now) {
    PyObject *task = new_instance(Task);
    if (task != NULL &&
        (SET(task, _engine, engine) < 0 || SET(task, comm, st) < 0 ||
         SET(task, plan, plan) < 0 || SET(task, seq, seqo) < 0 || SET(task, lane, lane) < 0 ||
         SET(task, result, result) < 0 || SET(task, t_issue, now) < 0 ||
         SET(task, last_progress, now) < 0 || SET(task, t_start, now) < 0 ||
         SET(task, state, RUNNING) < 0 || SET(st, last, Py_None) < 0))
        Py_CLEAR(task);
    return task;
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

/* 1 if registered memory exists while a plan's reg_matters (the Python path then looks at
 * where the buffers lie), 0 if not, -1 on error */
static int registered_may_matter(PyObject *st, PyObject *pcx) {
    if (AT(pcx, PX_REGM) != Py_True)
        return 0;
    PyObject *ctx = GET(st, ctx);
    if (ctx == NULL)
        return -1;
    int r = is_true(ctx, S__allocs);
    Py_DECREF(ctx);
    return r;
}

/* the lane's program run from its pc by _native.run until a flag wait that does not hold
 * yet, or the end; the lane's pc, waits_done and waiting updated (engine/code.py, run).
 * Its new pc, or -1 with the error raised (the lane unchanged). */
static Py_ssize_t run_program(PyObject *lane, PyObject *native, PyObject *code,
                              Py_ssize_t pc, PyObject *base, PyObject *send, PyObject *recv,
                              PyObject *scratch) {
    PyObject *pco = PyLong_FromSsize_t(pc);
    if (pco == NULL)
        return -1;
    PyObject *argv[6] = {native, pco, base, send, recv, scratch};
    PyObject *res = PyObject_Vectorcall(native_run, argv, 6, NULL);
    Py_DECREF(pco);
    if (res == NULL)
        return -1;
    Py_ssize_t npc = -1;
    long long waits = 0;
    if (PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2) {
        npc = PyLong_AsSsize_t(PyTuple_GET_ITEM(res, 0));
        waits = PyLong_AsLongLong(PyTuple_GET_ITEM(res, 1));
    }
    Py_DECREF(res);
    if (npc < 0 || PyErr_Occurred()) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "hpccoll express: _native.run returned no pc");
        return -1;
    }
    if (npc == pc)
        return npc;
    PyObject *v = NULL, *w = NULL;
    long long before = as_ll(lane, S_waits_done);
    int rc = -1;
    if (PyErr_Occurred() || (v = PyLong_FromSsize_t(npc)) == NULL ||
        (w = PyLong_FromLongLong(before + waits)) == NULL ||
        SET(lane, pc, v) < 0 || SET(lane, waits_done, w) < 0)
        goto out;
    /* the step it waits on (a WAIT instruction's last field), as code.run sets it */
    PyObject *waiting = Py_None;
    if (PyTuple_Check(code) && npc < PyTuple_GET_SIZE(code)) {
        PyObject *ins = PyTuple_GET_ITEM(code, npc);
        if (PyTuple_Check(ins) && PyTuple_GET_SIZE(ins) >= 4)
            waiting = PyTuple_GET_ITEM(ins, 3);
    }
    rc = SET(lane, waiting, waiting);
out:
    Py_XDECREF(v);
    Py_XDECREF(w);
    return rc < 0 ? -1 : npc;
}

/* CommState.issue's other loose route: a node-shared-memory program on host arrays,
 * started at issue while the engine has nothing to do (engine.solo, nothing live or
 * queued) and the communicator's slots have room; its waiter runs it.  Its lane is
 * Plan.lane's (the epoch base taken, the area's epoch moved past it), its start
 * Task.start's: the slots held, the program run to its first wait that does not hold.
 * None, nothing changed, wherever that route does not apply: the plan's program has no
 * C encoding (not built on every rank, a reduction _native.c lacks), registered memory
 * exists, the digest check is due, ... */
static PyObject *issue_program(PyObject *st, PyObject *call, PyObject *plan, PyObject *pcx) {
    PyObject *scx = NULL, *rt = NULL, *native = NULL, *code = NULL, *gate = NULL,
             *area = NULL, *send = NULL, *recv = NULL, *result = NULL, *lane = NULL,
             *task = NULL, *now = NULL, *seqo = NULL, *baseo = NULL, *exc = NULL, *v = NULL,
             *out = Py_None;
    PyObject *engine, *lock, *shm;
    int locked = 0, r;
    Py_INCREF(out);
    if ((r = registered_may_matter(st, pcx)) != 0)
        goto check;
    if ((scx = info(st, state_info)) == NULL)
        goto fail;
    shm = AT(scx, SX_SHM);
    if (AT(scx, SX_OK) != Py_True || AT(scx, SX_SOLO) != Py_True || shm == Py_None)
        goto out;
    if ((rt = GET(plan, rt)) == NULL)
        goto fail;
    if (rt == Py_None)
        goto out;                 /* made by the Python path, at the plan's first call */
    if ((native = GET(rt, native)) == NULL || (code = GET(rt, code)) == NULL)
        goto fail;
    if (native == Py_None || !PyTuple_Check(code))
        goto out;
    if ((gate = PyDict_GetItemWithError(shm, S_gate)) == NULL)
        goto fail_or_out;         /* made by the Python path, at the first program */
    Py_INCREF(gate);
    if ((area = PyDict_GetItemWithError(shm, S_area)) == NULL)
        goto fail_or_out;
    Py_INCREF(area);
    engine = AT(scx, SX_ENGINE);
    lock = AT(scx, SX_LOCK);
    /* the engine has nothing of its own to do (a program it runs may share the slots) */
    if ((r = is_true(engine, S__live)) != 0)
        goto check;
    if ((v = GET(engine, sq)) == NULL)
        goto fail;
    Py_ssize_t queued = PyObject_Length(v);
    if (queued != 0)
        goto fail_or_out;
    if ((send = GET(call, send)) == NULL || (recv = GET(call, recv)) == NULL ||
        (result = GET(call, result)) == NULL)
        goto fail;

    if (call_lock(lock, S_acquire) < 0)
        goto fail;
    locked = 1;
    long long seq = as_ll(st, S_seq);
    if (seq < 0 && PyErr_Occurred())
        goto fail;
    if (digest_due(scx, seq))
        goto out;
    if ((r = prev_started(st)) <= 0)
        goto check;
    long long held = as_ll(gate, S_held), cap = as_ll(gate, S_capacity);
    long long base = as_ll(area, S_epoch), slots = as_ll(area, S_slots);
    long long epochs = PyLong_AsLongLong(AT(pcx, PX_EPOCHS));
    long long tags = PyLong_AsLongLong(AT(scx, SX_TAGSPACE));
    if (PyErr_Occurred())
        goto fail;
    if (held >= cap || slots < 1 || tags < 1)
        goto out;

    /* -- committed: this collective, as CommState.issue and Plan.lane make it -- */
    if ((seqo = take_seq(st, scx, pcx, seq)) == NULL ||
        (baseo = PyLong_FromLongLong(base)) == NULL)
        goto fail;
    {   /* the next collective starts on a multiple of the slot count (Plan.lane) */
        long long next = (base + epochs + slots - 1) / slots * slots;
        PyObject *e = PyLong_FromLongLong(next);
        if (e == NULL || SET(area, epoch, e) < 0) {
            Py_XDECREF(e);
            goto fail;
        }
        Py_DECREF(e);
    }
    {
        PyObject *bufs = PyList_New(3), *bytes = PyList_New(3), *inflight = PyDict_New(),
                 *tag = PyLong_FromLongLong((seq % tags) * 2), *zero = PyLong_FromLong(0);
        int ok = bufs && bytes && inflight && tag && zero;
        if (ok) {
            PyList_SET_ITEM(bufs, 0, Py_NewRef(send));
            PyList_SET_ITEM(bufs, 1, Py_NewRef(recv));
            PyList_SET_ITEM(bufs, 2, Py_NewRef(NO_SCRATCH));
            for (int i = 0; i < 3; i++)
                PyList_SET_ITEM(bytes, i, Py_NewRef(Py_None));
            ok = (lane = new_instance(ProgramLane)) != NULL &&
                 SET(lane, program, AT(pcx, PX_PROGRAM)) == 0 && SET(lane, bufs, bufs) == 0 &&
                 SET(lane, _bytes, bytes) == 0 && SET(lane, itemsize, AT(pcx, PX_ITEMSIZE)) == 0 &&
                 SET(lane, op, AT(pcx, PX_OP)) == 0 && SET(lane, mpi, AT(scx, SX_DATA)) == 0 &&
                 SET(lane, tag, tag) == 0 && SET(lane, ops, HostOps) == 0 &&
                 SET(lane, pc, zero) == 0 && SET(lane, inflight, inflight) == 0 &&
                 SET(lane, waiting, Py_None) == 0 && SET(lane, waits_done, zero) == 0 &&
                 SET(lane, bytes_moved, zero) == 0 && SET(lane, shm, rt) == 0 &&
                 SET(lane, base, baseo) == 0 && SET(lane, pool, Py_None) == 0 &&
                 SET(lane, _pooled, Py_None) == 0 && SET(lane, holds, gate) == 0 &&
                 SET(lane, code, code) == 0;
        }
        Py_XDECREF(bufs);
        Py_XDECREF(bytes);
        Py_XDECREF(inflight);
        Py_XDECREF(tag);
        Py_XDECREF(zero);
        if (!ok)
            goto fail;
    }
    if ((now = monotonic()) == NULL ||
        (task = make_task(engine, st, plan, seqo, lane, result, now)) == NULL)
        goto fail;
    Py_CLEAR(v);
    if ((v = PyLong_FromLongLong(held + 1)) == NULL || SET(gate, held, v) < 0)
        goto fail;
    Py_CLEAR(out);
    out = Py_NewRef(task);
    /* Task.start's poll: the program runs to its first wait that does not hold */
    Py_CLEAR(v);
    if ((v = PyLong_FromLong(1)) == NULL || SET(task, polls, v) < 0)
        goto fail;
    Py_ssize_t pc = run_program(lane, native, code, 0, baseo, send, recv, NO_SCRATCH);
    if (pc < 0) {
        exc = take_exception();
        goto program_error;
    }
    if (pc >= PyLong_AsSsize_t(AT(pcx, PX_NSTEPS)) &&
        (SET(task, state, DONE) < 0 || SET(task, t_end, now) < 0))
        goto fail;
    if (SET(task, posted, Py_True) < 0 || SET(task, loose, Py_True) < 0 ||
        PyDict_SetItem(AT(scx, SX_PROGRAMS), task, Py_None) < 0 ||
        PyDict_SetItem(AT(scx, SX_LOOSE), task, Py_None) < 0)
        goto fail;
    p_issued++;
    goto out;

program_error:
    /* what Task.poll's failure would do (the task failed with it), the engine adopting
     * it after the lock, as CommState.issue does with a task that failed at its start */
    failed_starts++;
    if (SET(task, posted, Py_True) < 0)
        goto fail;
    locked = 0;
    if (hand_failure(st, lock, task, exc, 1) < 0)
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
fail:
    Py_CLEAR(out);
out:
    if (locked && release_keeping_error(lock) < 0)
        Py_CLEAR(out);
    Py_XDECREF(scx);
    Py_XDECREF(rt);
    Py_XDECREF(native);
    Py_XDECREF(code);
    Py_XDECREF(gate);
    Py_XDECREF(area);
    Py_XDECREF(send);
    Py_XDECREF(recv);
    Py_XDECREF(result);
    Py_XDECREF(lane);
    Py_XDECREF(task);
    Py_XDECREF(now);
    Py_XDECREF(seqo);
    Py_XDECREF(baseo);
    Py_XDECREF(exc);
    Py_XDECREF(v);
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
    PyObject *recipe, *persist, *engine, *lock;      /* borrowed from pcx, scx */
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
    if (AT(pcx, PX_OK) != Py_True) {
        if (AT(pcx, PX_PROG) == Py_True)
            Py_SETREF(out, issue_program(st, call, plan, pcx));
        goto out;
    }
    /* registered buffers would change the plan: while registered memory exists, the
     * Python path looks at where these lie */
    if ((r = registered_may_matter(st, pcx)) != 0)
        goto check;
    if ((scx = info(st, state_info)) == NULL)
        goto fail;
    if (AT(scx, SX_OK) != Py_True)
        goto out;
    recipe = AT(pcx, PX_RECIPE);
    persist = AT(pcx, PX_PERSIST);
    kind = (int)PyLong_AsLong(AT(pcx, PX_KIND));
    engine = AT(scx, SX_ENGINE);
    lock = AT(scx, SX_LOCK);
    if ((recv = GET(call, recv)) == NULL || (result = GET(call, result)) == NULL)
        goto fail;

    if (call_lock(lock, S_acquire) < 0)
        goto fail;
    locked = 1;
    if ((seq = as_ll(st, S_seq)) < 0 && PyErr_Occurred())
        goto fail;
    if (digest_due(scx, seq))
        goto out;
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
    if ((seqo = take_seq(st, scx, pcx, seq)) == NULL)
        goto fail_rq;
    if (pset != NULL) {
        PyObject *u = PyLong_FromLongLong(uses + 1);
        if (u == NULL || SET(pset, uses, u) < 0) {
            Py_XDECREF(u);
            goto fail_rq;
        }
        Py_DECREF(u);
    }
    if ((lane = new_instance(MpiLane)) == NULL || SET(lane, recipe, recipe) < 0 ||
        SET(lane, send, send) < 0 || SET(lane, recv, recv) < 0 ||
        SET(lane, slot, slot ? slot : Py_None) < 0 ||
        SET(lane, req, rq ? rq : Py_None) < 0 || SET(lane, done, Py_False) < 0)
        goto fail_rq;
    Py_CLEAR(rq);
    if ((now = monotonic()) == NULL ||
        (task = make_task(engine, st, plan, seqo, lane, result, now)) == NULL)
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
    if (hand_failure(st, lock, task, exc, 0) < 0)
        goto fail;
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
    if (locked && release_keeping_error(lock) < 0)
        Py_CLEAR(out);
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
static int done_loose(PyObject *engine, PyObject *ecx, PyObject *task, PyObject *lane,
                      int program) {
    int rc = -1, finished = 0;
    PyObject *slot = NULL, *srecv = NULL, *recv = NULL, *plan = NULL, *pcx = NULL,
             *now = NULL, *row = NULL;
    if ((plan = GET(task, plan)) == NULL || (pcx = info(plan, plan_info)) == NULL)
        goto out;
    if (program) {
        /* the communicator's slots given back (the lane held them from its start) */
        PyObject *gate = GET(lane, holds);
        long long held = gate == NULL ? -1 : as_ll(gate, S_held);
        PyObject *h = PyErr_Occurred() ? NULL : PyLong_FromLongLong(held - 1);
        int bad = h == NULL || SET(gate, held, h) < 0;
        Py_XDECREF(h);
        Py_XDECREF(gate);
        if (bad)
            goto out;
    } else if ((slot = GET(lane, slot)) == NULL) {
        goto out;
    } else if (slot != Py_None) {
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
    if ((!program && SET(lane, done, Py_True) < 0) || SET(task, state, DONE) < 0 ||
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
    /* lane.release(): a program's lane made here holds no pooled scratch */
    if (program ? (SET(lane, bufs, Py_None) < 0 || SET(lane, _bytes, Py_None) < 0 ||
                   SET(lane, shm, Py_None) < 0)
                : (SET(lane, send, Py_None) < 0 || SET(lane, recv, Py_None) < 0))
        goto out;
    if (SET(task, _done, Py_True) < 0)
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

/* Engine._adopt_loose(task, poll_error=<the raised exception>): the engine explains it */
static int adopt_error(PyObject *engine, PyObject *task) {
    PyObject *exc = take_exception();
    PyObject *a = PyTuple_Pack(1, task), *kw = Py_BuildValue("{OO}", S_poll_error, exc);
    PyObject *fn = GET(engine, _adopt_loose);
    PyObject *res = (a && kw && fn) ? PyObject_Call(fn, a, kw) : NULL;
    Py_XDECREF(a);
    Py_XDECREF(kw);
    Py_XDECREF(fn);
    Py_XDECREF(exc);
    if (res == NULL)
        return -1;
    Py_DECREF(res);
    return 0;
}

/* One poll of the loose task t (the xlock held), as Engine._step_loose makes it: a
 * program run from where it stopped (engine/code.py, run), an MPI request tested; one
 * that ends completes (_done_loose), one that fails goes to the engine with its error.
 * 1 if it moved, 0 if not, 2 if it is not one this module polls (nothing done: a check
 * rides along, an interpreted program, pooled scratch, ...), -1 on error. */
static int step_task(PyObject *engine, PyObject *ecx, PyObject *t) {
    PyObject *check = NULL, *lane = NULL, *shm = NULL, *native = NULL, *code = NULL,
             *bufs = NULL, *base = NULL, *pooled = NULL, *req = NULL;
    int rc = -1;
    if ((check = GET(t, check)) == NULL || (lane = GET(t, lane)) == NULL)
        goto out;
    rc = 2;
    if (check != Py_None)
        goto out;
    if (ProgramLane != NULL && (PyObject *)Py_TYPE(lane) == ProgramLane) {
        rc = -1;
        if ((shm = GET(lane, shm)) == NULL || (code = GET(lane, code)) == NULL ||
            (bufs = GET(lane, bufs)) == NULL || (base = GET(lane, base)) == NULL ||
            (pooled = GET(lane, _pooled)) == NULL)
            goto out;
        rc = 2;
        if (shm == Py_None || pooled != Py_None || !PyTuple_Check(code) ||
            !PyList_Check(bufs) || PyList_GET_SIZE(bufs) != 3)
            goto out;
        rc = -1;
        if ((native = GET(shm, native)) == NULL)
            goto out;
        rc = 2;
        if (native == Py_None)
            goto out;
        rc = -1;
        Py_ssize_t n = PyTuple_GET_SIZE(code), pc = (Py_ssize_t)as_ll(lane, S_pc), npc = pc;
        if (PyErr_Occurred())
            goto out;
        if (pc < n) {
            PyObject **b = &PyList_GET_ITEM(bufs, 0);
            if ((npc = run_program(lane, native, code, pc, base, b[0], b[1], b[2])) < 0) {
                rc = adopt_error(engine, t) < 0 ? -1 : 1;
                goto out;
            }
        }
        if (npc >= n) {
            if (done_loose(engine, ecx, t, lane, 1) < 0)
                goto out;
            p_completed++;
            rc = 1;
        } else {
            rc = npc != pc;
        }
    } else if ((PyObject *)Py_TYPE(lane) == MpiLane) {
        if ((req = GET(lane, req)) == NULL)
            goto out;
        if (req == Py_None)
            goto out;
        PyObject *res = PyObject_CallMethodNoArgs(req, S_Test);
        if (res == NULL) {       /* MPI's error: the engine explains it */
            rc = adopt_error(engine, t) < 0 ? -1 : 1;
            goto out;
        }
        int done = res == Py_True;
        Py_DECREF(res);
        rc = 0;
        if (done) {
            if (done_loose(engine, ecx, t, lane, 0) < 0)
                rc = -1;
            else {
                completed++;
                rc = 1;
            }
        }
    }
out:
    Py_XDECREF(check);
    Py_XDECREF(lane);
    Py_XDECREF(shm);
    Py_XDECREF(native);
    Py_XDECREF(code);
    Py_XDECREF(bufs);
    Py_XDECREF(base);
    Py_XDECREF(pooled);
    Py_XDECREF(req);
    return rc;
}

/* Engine.wait_loose's spin where programs are loose (the xlock held): ``task`` alone, or
 * (``group``) every loose collective in turn, as the waiter's Engine._step_loose does,
 * until the task completes or spin_polls rounds in a row move nothing (and, with no
 * timeout, yield_polls more with sched_yield before each).  1 done, 0 not (the Python
 * waiter goes on from there, as it does where a loose collective is not one this module
 * polls; an error went to the engine), -1 error. */
static int spin_loose(PyObject *engine, PyObject *ecx, PyObject *task, PyObject *timeout,
                      int group) {
    long long polls = PyLong_AsLongLong(AT(ecx, EX_POLLS));
    long long yields = timeout == Py_None ? PyLong_AsLongLong(AT(ecx, EX_YIELDS)) : 0;
    if (PyErr_Occurred())
        return -1;
    for (long long idle = 0; idle < polls + yields;) {
        int r = is_true(task, S_loose);
        if (r <= 0) {
            if (r < 0)
                return -1;
            break;
        }
        if (idle >= polls) {
            Py_BEGIN_ALLOW_THREADS
            sched_yield();
            Py_END_ALLOW_THREADS
        }
        int moved = 0;
        if (group) {
            PyObject *tasks = PyDict_Keys(AT(ecx, EX_LOOSE));
            if (tasks == NULL)
                return -1;
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tasks); i++) {
                PyObject *t = PyList_GET_ITEM(tasks, i);
                if ((r = is_true(t, S_loose)) == 0)
                    continue;           /* (completed in this round) */
                if (r > 0)
                    r = step_task(engine, ecx, t);
                if (r < 0 || r == 2) {
                    Py_DECREF(tasks);
                    return r < 0 ? -1 : 0;
                }
                moved |= r;
            }
            Py_DECREF(tasks);
        } else {
            if ((r = step_task(engine, ecx, task)) < 0)
                return -1;
            if (r == 2)
                return 0;
            moved = r;
        }
        idle = moved ? 0 : idle + 1;
    }
    return is_true(task, S__done);
}

static PyObject *wait(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "wait(task, timeout)");
        return NULL;
    }
    PyObject *task = args[0], *timeout = args[1];
    PyObject *engine = NULL, *ecx = NULL, *xlock = NULL, *v = NULL, *lane = NULL,
             *req = NULL;
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
    int program = ProgramLane != NULL && (PyObject *)Py_TYPE(lane) == ProgramLane;
    if (!program && (PyObject *)Py_TYPE(lane) != MpiLane)
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
    /* a program is loose besides this one (or this one is): the waiter steps them all */
    int group = PyDict_GET_SIZE(AT(ecx, EX_LOOSE)) > 1 &&
                (program || PyDict_GET_SIZE(AT(ecx, EX_PROGRAMS)) != 0);
    if (program || group) {
        if ((r = spin_loose(engine, ecx, task, timeout, group)) < 0)
            goto fail;
        done = r;
        goto out;
    }
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
            if (adopt_error(engine, task) < 0)
                goto fail;
            goto out;
        }
        int t = res == Py_True;
        Py_DECREF(res);
        if (t) {
            if (done_loose(engine, ecx, task, lane, 0) < 0)
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
    if (locked && release_keeping_error(xlock) < 0)
        failed = 1;
    Py_XDECREF(engine);
    Py_XDECREF(ecx);
    Py_XDECREF(v);
    Py_XDECREF(lane);
    Py_XDECREF(req);
    if (failed)
        return NULL;
    return PyBool_FromLong(done);
}

static PyObject *counts(PyObject *m, PyObject *unused) {
    return Py_BuildValue("(LLL)", issued, completed, failed_starts);
}

static PyObject *program_counts(PyObject *m, PyObject *unused) {
    return Py_BuildValue("(LL)", p_issued, p_completed);
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(Task, MpiLane, RUNNING, DONE, FAILED, slots): what the calls make"},
    {"issue", (PyCFunction)(void (*)(void))issue, METH_FASTCALL,
     "issue(state, call) -> Task or None: CommState.issue's loose route"},
    {"wait", (PyCFunction)(void (*)(void))wait, METH_FASTCALL,
     "wait(task, timeout) -> bool: a loose MPI task's first spin and completion"},
    {"bind_programs", bind_programs, METH_VARARGS,
     "bind_programs(ProgramLane, HostOps, no_scratch, native_run): the programs' route"},
    {"counts", counts, METH_NOARGS, "(issued, completed, failed at start) by this module, in this process"},
    {"program_counts", program_counts, METH_NOARGS,
     "(issued, completed) shared-memory programs by this module, in this process"},
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
