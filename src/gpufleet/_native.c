/* gpufleet._native: the default policy's descent measure and scores and FGD's frag_amount of a few node states, in C
(optional).

Why: a cached-key decision measures one to four node states (policies/default/descent.py, DescentScore._measure;
FGD's scores, policies/paper/workload.py, frag_amount's table path), about 25 (measure) or 12 (frag_amount) numpy
calls of about a microsecond each on arrays that small; the arithmetic itself is a few hundred operations.  descent()
goes one step further for the default's scores (DescentScore._native_scores): the node view, the placements of a
share, the before-cache, the quantising and the per-GPU terms around the measure, another ~40 numpy calls a score.  This computes the same numbers with the same floating-point operations in the same order as the numpy
path, so the result is the same bits:

  * every per-GPU sum is of whole numbers (int64): exact in any order;
  * the sum over shapes (numpy's add.reduce over a contiguous last axis) starts from 0.0 and adds numpy's pairwise
    sum (8 accumulators from 8 items, halves above 128), as pairwise_sum below;
  * the mean over ratio quantiles (add.reduce over axis 0 of [Q, S]) starts from 0.0 and adds the rows in order when
    S > 1, and is one contiguous reduce (0.0 plus the pairwise sum) when S == 1;
  * np.maximum(a, b) is b unless a > b or a is NaN (numpy 2's result for equal zeros: the second);
  * no contraction of a * b + c into one fused operation (setup.py passes -ffp-contract=off; x87's extended precision
    refused below).

Only the CPython C API and the buffer protocol: no numpy headers, so building needs nothing but a C compiler.  The
caller passes a float64 output array; measure() and frag_amount() return False, writing nothing, whenever an input
is not of the types, layout or range they handle (the caller then takes the numpy path, which is also the reference
the property tests compare against: tests/policies/default/test_native_measure.py,
tests/policies/default/test_native_descent.py and tests/policies/test_native_frag.py).
*/
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "double arithmetic must be evaluated in double precision (FLT_EVAL_METHOD 0) to give numpy's bits"
#endif

#define GROUP 8      /* numpy's pairwise sum: accumulators */
#define BLOCK 128    /* numpy's PW_BLOCKSIZE */
#define MAX_T 1024   /* shapes (and ratio quantiles) held on the stack; more take the numpy path */

static double
pairwise_sum(const double *a, Py_ssize_t n)
{
    if (n < GROUP) {
        double res = 0.;
        for (Py_ssize_t i = 0; i < n; i++) {
            res += a[i];
        }
        return res;
    }
    if (n <= BLOCK) {
        double r[GROUP];
        Py_ssize_t i;
        for (int j = 0; j < GROUP; j++) {
            r[j] = a[j];
        }
        for (i = GROUP; i < n - (n % GROUP); i += GROUP) {
            for (int j = 0; j < GROUP; j++) {
                r[j] += a[i + j];
            }
        }
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) {
            res += a[i];
        }
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % GROUP;
    return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

static inline double
np_maximum(double a, double b)
{
    return (a > b || a != a) ? a : b;
}

/* The element kinds accepted (bits, so that a caller may accept several): int64, int32, float64, bool; native byte
   order, C-contiguous. */
enum kind { K_OTHER = 0, K_I64 = 1, K_I32 = 2, K_F64 = 4, K_BOOL = 8 };

static enum kind
kind_of(const Py_buffer *v)
{
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=') {
        f++;
    }
#if PY_LITTLE_ENDIAN
    else if (*f == '<') {
        f++;
    }
#else
    else if (*f == '>' || *f == '!') {
        f++;
    }
#endif
    if (f[0] == '\0' || f[1] != '\0') {
        return K_OTHER;
    }
    switch (f[0]) {
    case 'q': case 'l': case 'i':
        if (v->itemsize == 8) {
            return K_I64;
        }
        return v->itemsize == 4 ? K_I32 : K_OTHER;
    case 'd':
        return v->itemsize == 8 ? K_F64 : K_OTHER;
    case '?':
        return v->itemsize == 1 ? K_BOOL : K_OTHER;
    default:
        return K_OTHER;
    }
}

#define NBUF 24  /* the most a function holds at once */

typedef struct {
    Py_buffer v[NBUF];
    int n;
} buffers;

static void
release(buffers *b)
{
    for (int i = 0; i < b->n; i++) {
        PyBuffer_Release(&b->v[i]);
    }
    b->n = 0;
}

/* Gets a C-contiguous buffer of ndim dimensions and one of the kinds wanted (bits); NULL when it is not one (no
   Python error left set: the caller falls back). */
static Py_buffer *
get(buffers *b, PyObject *o, int ndim, int want, int writable)
{
    if (b->n >= NBUF) {
        return NULL;
    }
    Py_buffer *v = &b->v[b->n];
    if (PyObject_GetBuffer(o, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Clear();
        return NULL;
    }
    b->n++;
    if (v->ndim != ndim) {
        return NULL;
    }
    if (!(kind_of(v) & want)) {
        return NULL;
    }
    return v;
}

/* Free milli of every GPU in 0..L-1 (a row of the table): else the caller declines (numpy's take raises). */
static int
gpus_in_range(const int64_t *g, Py_ssize_t n, Py_ssize_t L)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (g[i] < 0 || g[i] >= L) {
            return 0;
        }
    }
    return 1;
}

static inline int64_t
model_at(const void *model, int model_i32, Py_ssize_t s)
{
    return model_i32 ? ((const int32_t *)model)[s] : ((const int64_t *)model)[s];
}

/* Every model a row of an [M, T] table, negative from the end (numpy's indexing): else numpy raises. */
static int
models_in_range(const void *model, int model_i32, Py_ssize_t S, Py_ssize_t M)
{
    for (Py_ssize_t s = 0; s < S; s++) {
        int64_t mi = model_at(model, model_i32, s);
        if (mi < -M || mi >= M) {
            return 0;
        }
    }
    return 1;
}

/* State s's row of the [M, T] bool table (models_in_range checked first). */
static inline const char *
ok_row(const void *ok, const void *model, int model_i32, Py_ssize_t s, Py_ssize_t M, Py_ssize_t T)
{
    int64_t mi = model_at(model, model_i32, s);
    return (const char *)ok + (mi < 0 ? mi + M : mi) * T;
}

/* The table's rows of one state's G GPUs, summed into sums[C]: whole numbers. */
static inline void
sum_rows(int64_t *sums, const int64_t *tab, Py_ssize_t C, const int64_t *g, Py_ssize_t G)
{
    memcpy(sums, tab + g[0] * C, C * sizeof(int64_t));
    for (Py_ssize_t j = 1; j < G; j++) {
        const int64_t *row = tab + g[j] * C;
        for (Py_ssize_t k = 0; k < C; k++) {
            sums[k] += row[k];
        }
    }
}

/* frag_amount of one state from its summed table row (sums[0] the idle milli, sums[1 + t] the idle milli on GPUs
   that hold shape t's share, sums[1 + T + t] how many hold it): per shape, the idle milli on GPUs too small for it
   where it fits (Q3: the shape asks GPUs and may use the model (ok, and gpu_shape where given), enough GPUs hold it,
   the CPU is enough), all idle milli otherwise; as float64 times the frequency, then 0.0 plus numpy's pairwise sum
   (add.reduce over a contiguous row).  tmp holds T doubles. */
static double
frag_of(const int64_t *sums, int64_t total, Py_ssize_t T, const char *ok, const char *gpu_shape, const int64_t *cnt,
        const void *cpu_t, int cpu_t_f, int64_t cs, const double *fr, double *tmp)
{
    for (Py_ssize_t t = 0; t < T; t++) {
        int cpu_fits = cpu_t_f ? ((double)cs >= ((const double *)cpu_t)[t]) : (cs >= ((const int64_t *)cpu_t)[t]);
        int q3 = ok[t] && (gpu_shape == NULL || gpu_shape[t]) && sums[1 + T + t] >= cnt[t] && cpu_fits;
        int64_t per = q3 ? total - sums[1 + t] : total;
        tmp[t] = (double)per * fr[t];
    }
    return 0.0 + pairwise_sum(tmp, T);
}

/* What measure() and descent() read of the target workload and the weights: the measure's parameters. */
typedef struct {
    const char *ok;          /* [M, T] bool: the shape asks GPUs and may use the model */
    const int64_t *tab;      /* [L, C] int64: _gpu_table */
    const int64_t *cnt;      /* [T] */
    const void *cpu_t;       /* [T] int64 or float64 */
    const double *fr;        /* [T] */
    const double *qr;        /* [Q] or NULL */
    Py_ssize_t T, L, C, M, Q;
    int cpu_t_f, strand, mem_strand;
    double k_cpu, k_mem, w_strand, w_sliver;
} mparams;

/* The measure of one node state (cpu cs, GPUs g[G], memory ms, model row mi); single: the state is the only one of
   its batch (numpy reduces the quantiles of one state pairwise).  tmp holds max(T, Q) doubles, sums C int64. */
static double
measure_state(const mparams *p, int64_t cs, const int64_t *g, Py_ssize_t G, int64_t ms, int64_t mi, int single,
              double *tmp, int64_t *sums)
{
    sum_rows(sums, p->tab, p->C, g, G);
    const int64_t total = sums[0];
    double frag = frag_of(sums, total, p->T, p->ok + (mi < 0 ? mi + p->M : mi) * p->T, NULL, p->cnt, p->cpu_t,
                          p->cpu_t_f, cs, p->fr, tmp);
    const double sliver = (double)sums[p->C - 1];
    if (!p->strand) {
        return frag + (0.0 + p->w_sliver * sliver);
    }
    const double tot = (double)total;
    const double cpu0 = (double)(cs > 0 ? cs : 0);
    double stranded;
    if (p->qr != NULL) {
        const double *qr = p->qr;
        const Py_ssize_t Q = p->Q;
        double acc;
        if (single) {  /* numpy reduces the one column as a contiguous run: pairwise */
            for (Py_ssize_t i = 0; i < Q; i++) {
                tmp[i] = np_maximum(0.0, tot - cpu0 / qr[i]);
            }
            acc = 0.0 + pairwise_sum(tmp, Q);
        }
        else {
            acc = 0.0;
            for (Py_ssize_t i = 0; i < Q; i++) {
                acc += np_maximum(0.0, tot - cpu0 / qr[i]);
            }
        }
        stranded = acc / (double)Q;
    }
    else {
        stranded = np_maximum(0.0, tot - cpu0 * p->k_cpu);
    }
    if (p->mem_strand) {
        const double mem0 = (double)(ms > 0 ? ms : 0);
        stranded = np_maximum(stranded, tot - mem0 * p->k_mem);
    }
    return frag + (p->w_strand * stranded + p->w_sliver * sliver);
}

/* take_packed (policies.paper._common) of one node: after is row less count GPUs of milli, each the least
   sufficient GPU not yet taken (first of equals); stops early where none is left. */
static void
take_packed(int64_t *after, const int64_t *row, Py_ssize_t G, long long count, long long milli)
{
    memcpy(after, row, G * sizeof(int64_t));
    for (long long c = 0; c < count; c++) {
        Py_ssize_t best = -1;
        for (Py_ssize_t j = 0; j < G; j++) {
            if (after[j] == row[j] && row[j] >= milli && (best < 0 || row[j] < row[best])) {
                best = j;
            }
        }
        if (best < 0) {
            break;
        }
        after[best] -= milli;
        if (milli == 0) {
            break;  /* nothing taken: every further GPU the same */
        }
    }
}

/* Reads the measure's 12 parameters from args[0..11] (shape_ok, table, count, cpu_t, freq, q_rhos, k_cpu, k_mem,
   strand, mem_strand, strand_weight, sliver_weight) into p: 1 where they are of the kinds taken, 0 where the caller
   declines, -1 with a Python error set. */
static int
get_params(buffers *b, PyObject *const *args, mparams *p)
{
    p->k_cpu = PyFloat_AsDouble(args[6]);
    p->k_mem = PyFloat_AsDouble(args[7]);
    p->strand = PyObject_IsTrue(args[8]);
    p->mem_strand = PyObject_IsTrue(args[9]);
    p->w_strand = PyFloat_AsDouble(args[10]);
    p->w_sliver = PyFloat_AsDouble(args[11]);
    if (PyErr_Occurred() || p->strand < 0 || p->mem_strand < 0) {
        return -1;
    }
    Py_buffer *ok = get(b, args[0], 2, K_BOOL, 0);
    Py_buffer *table = get(b, args[1], 2, K_I64, 0);
    Py_buffer *count = get(b, args[2], 1, K_I64, 0);
    Py_buffer *cpu_t = get(b, args[3], 1, K_I64 | K_F64, 0);
    Py_buffer *freq = get(b, args[4], 1, K_F64, 0);
    Py_buffer *q = NULL;
    if (!(ok && table && count && cpu_t && freq)) {
        return 0;
    }
    if (args[5] != Py_None && (q = get(b, args[5], 1, K_F64, 0)) == NULL) {
        return 0;
    }
    p->T = count->shape[0];
    p->L = table->shape[0];
    p->C = table->shape[1];
    p->M = ok->shape[0];
    p->Q = q ? q->shape[0] : 0;
    if (p->T == 0 || p->C != 2 * p->T + 2 || ok->shape[1] != p->T || cpu_t->shape[0] != p->T
        || freq->shape[0] != p->T || p->T > MAX_T || (q != NULL && (p->Q == 0 || p->Q > MAX_T))) {
        return 0;
    }
    p->ok = ok->buf;
    p->tab = table->buf;
    p->cnt = count->buf;
    p->cpu_t = cpu_t->buf;
    p->cpu_t_f = kind_of(cpu_t) == K_F64;
    p->fr = freq->buf;
    p->qr = q ? q->buf : NULL;
    return 1;
}

PyDoc_STRVAR(measure_doc,
"measure(out, cpu, gpu, mem, model, shape_ok, table, count, cpu_t, freq, q_rhos, k_cpu, k_mem, strand, mem_strand,\n"
"        strand_weight, sliver_weight) -> bool\n\n"
"DescentScore._measure's table path for S node states into out ([S] float64): cpu, mem [S] int64, gpu [S, G] int64,\n"
"model [S] int32/int64 (a row of shape_ok [M, T] bool, negative from the end), table [L, 2T + 2] int64 (_gpu_table),\n"
"count [T] int64, cpu_t [T] int64 or float64, freq [T] float64, q_rhos [Q] float64 or None (the mean ratio: k_cpu),\n"
"k_mem (used where mem_strand), strand (whether the stranded term is computed; its weight otherwise unused).\n"
"False (out untouched) where an input is of another type or layout, or a GPU's milli or a model is out of range.");

static PyObject *
measure(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "measure() takes 17 arguments");
        return NULL;
    }
    buffers b = {.n = 0};
    PyObject *result = Py_False;
    double tmp[MAX_T];
    int64_t sums[2 * MAX_T + 2];
    mparams p;

    Py_buffer *out = get(&b, args[0], 1, K_F64, 1);
    Py_buffer *cpu = get(&b, args[1], 1, K_I64, 0);
    Py_buffer *gpu = get(&b, args[2], 2, K_I64, 0);
    Py_buffer *mem = get(&b, args[3], 1, K_I64, 0);
    Py_buffer *model = get(&b, args[4], 1, K_I64 | K_I32, 0);
    if (!(out && cpu && gpu && mem && model)) {
        goto done;
    }
    int got = get_params(&b, args + 5, &p);
    if (got <= 0) {
        result = got < 0 ? NULL : Py_False;
        goto done;
    }
    const Py_ssize_t S = cpu->shape[0], G = gpu->shape[1];
    if (out->shape[0] != S || gpu->shape[0] != S || mem->shape[0] != S || model->shape[0] != S || S == 0 || G == 0) {
        goto done;
    }
    const int64_t *g = gpu->buf, *c = cpu->buf, *m = mem->buf;
    const int model_i32 = kind_of(model) == K_I32;
    if (!gpus_in_range(g, S * G, p.L) || !models_in_range(model->buf, model_i32, S, p.M)) {
        goto done;
    }
    double *o = out->buf;
    for (Py_ssize_t s = 0; s < S; s++) {
        o[s] = measure_state(&p, c[s], g + s * G, G, m[s], model_at(model->buf, model_i32, s), S == 1, tmp, sums);
    }
    result = Py_True;
done:
    release(&b);
    if (result != NULL) {
        Py_INCREF(result);
    }
    return result;
}

PyDoc_STRVAR(frag_amount_doc,
"frag_amount(out, cpu, gpu, model, access, gpu_shape, table, count, cpu_t, freq) -> bool\n\n"
"policies.paper.workload.frag_amount's table path for S node states into out ([S] float64): cpu [S] int64,\n"
"gpu [S, G] int64, model [S] int32/int64 (a row of access [M, T] bool, negative from the end), gpu_shape [T] bool\n"
"(the shape asks GPUs), table [L, 2T + 1] int64 (workload._gpu_table), count [T] int64, cpu_t [T] int64 or float64,\n"
"freq [T] float64.  False (out untouched) where an input is of another type or layout, or a GPU's milli or a model\n"
"is out of range.");

static PyObject *
frag_amount(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "frag_amount() takes 10 arguments");
        return NULL;
    }
    buffers b = {.n = 0};
    PyObject *result = Py_False;
    double tmp[MAX_T];
    int64_t sums[2 * MAX_T + 1];

    Py_buffer *out = get(&b, args[0], 1, K_F64, 1);
    Py_buffer *cpu = get(&b, args[1], 1, K_I64, 0);
    Py_buffer *gpu = get(&b, args[2], 2, K_I64, 0);
    Py_buffer *model = get(&b, args[3], 1, K_I64 | K_I32, 0);
    Py_buffer *ok = get(&b, args[4], 2, K_BOOL, 0);
    Py_buffer *shape = get(&b, args[5], 1, K_BOOL, 0);
    Py_buffer *table = get(&b, args[6], 2, K_I64, 0);
    Py_buffer *count = get(&b, args[7], 1, K_I64, 0);
    Py_buffer *cpu_t = get(&b, args[8], 1, K_I64 | K_F64, 0);
    Py_buffer *freq = get(&b, args[9], 1, K_F64, 0);
    if (!(out && cpu && gpu && model && ok && shape && table && count && cpu_t && freq)) {
        goto done;
    }
    const Py_ssize_t S = cpu->shape[0], G = gpu->shape[1], T = count->shape[0];
    const Py_ssize_t L = table->shape[0], C = table->shape[1], M = ok->shape[0];
    if (out->shape[0] != S || gpu->shape[0] != S || model->shape[0] != S || S == 0 || G == 0 || T == 0
        || C != 2 * T + 1 || ok->shape[1] != T || shape->shape[0] != T || cpu_t->shape[0] != T
        || freq->shape[0] != T || T > MAX_T) {
        goto done;
    }
    const int64_t *g = gpu->buf, *c = cpu->buf;
    const int cpu_t_f = kind_of(cpu_t) == K_F64, model_i32 = kind_of(model) == K_I32;
    if (!gpus_in_range(g, S * G, L) || !models_in_range(model->buf, model_i32, S, M)) {
        goto done;
    }
    double *o = out->buf;
    for (Py_ssize_t s = 0; s < S; s++) {
        sum_rows(sums, table->buf, C, g + s * G, G);
        o[s] = frag_of(sums, sums[0], T, ok_row(ok->buf, model->buf, model_i32, s, M, T), shape->buf, count->buf,
                       cpu_t->buf, cpu_t_f, c[s], freq->buf, tmp);
    }
    result = Py_True;
done:
    release(&b);
    Py_INCREF(result);
    return result;
}

#define MAX_G 64  /* GPUs per node held on the stack; more take the Python path */

PyDoc_STRVAR(descent_doc,
"descent(out, nodes, cpu_free, mem_free, gpu_free, gpu_usable, node_model, vals, vers, version, elig, r_cpu, r_mem,\n"
"        milli, count, quant, term, fit, shape_ok, table, count_t, cpu_t, freq, q_rhos, k_cpu, k_mem, strand,\n"
"        mem_strand, strand_weight, sliver_weight) -> bool\n\n"
"DescentScore's scores of k nodes (nodes [k] int64, rows of the state's columns: cpu_free, mem_free [n] int64,\n"
"gpu_free [n, G] int64, gpu_usable [n, G] bool, node_model [n] int32/int64), through the measure (the last 12\n"
"arguments, as measure()'s) and the before-cache (vals [n] float64, vers [n] int64, written for the stale nodes;\n"
"version [n] int64).  elig None: _node_scores into out [k] (count > 0: take_packed of count GPUs of milli);\n"
"elig [k, G] bool: _gpu_scores of a share of milli into out [k, G] (-inf where not eligible), plus term and less fit\n"
"(None or float64 per free milli).  quant: the score's step (<= 0: none).  False (nothing written) where an input is\n"
"of another type or layout or out of range: the caller takes the Python path.");

static PyObject *
descent(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 30) {
        PyErr_SetString(PyExc_TypeError, "descent() takes 30 arguments");
        return NULL;
    }
    const long long r_cpu = PyLong_AsLongLong(args[11]);
    const long long r_mem = PyLong_AsLongLong(args[12]);
    const long long milli = PyLong_AsLongLong(args[13]);
    const long long count = PyLong_AsLongLong(args[14]);
    const double quant = PyFloat_AsDouble(args[15]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    buffers b = {.n = 0};
    PyObject *result = Py_False;
    double tmp[MAX_T];
    int64_t sums[2 * MAX_T + 2];
    int64_t row[MAX_G], after[MAX_G];
    mparams p;
    const int share = args[10] != Py_None;

    Py_buffer *out = get(&b, args[0], share ? 2 : 1, K_F64, 1);
    Py_buffer *nodes = get(&b, args[1], 1, K_I64, 0);
    Py_buffer *cpu_free = get(&b, args[2], 1, K_I64, 0);
    Py_buffer *mem_free = get(&b, args[3], 1, K_I64, 0);
    Py_buffer *gpu_free = get(&b, args[4], 2, K_I64, 0);
    Py_buffer *usable = get(&b, args[5], 2, K_BOOL, 0);
    Py_buffer *node_model = get(&b, args[6], 1, K_I64 | K_I32, 0);
    Py_buffer *vals = get(&b, args[7], 1, K_F64, 1);
    Py_buffer *vers = get(&b, args[8], 1, K_I64, 1);
    Py_buffer *version = get(&b, args[9], 1, K_I64, 0);
    Py_buffer *elig = NULL, *term = NULL, *fit = NULL;
    if (!(out && nodes && cpu_free && mem_free && gpu_free && usable && node_model && vals && vers && version)) {
        goto done;
    }
    if (share && ((elig = get(&b, args[10], 2, K_BOOL, 0)) == NULL
                  || (args[16] != Py_None && (term = get(&b, args[16], 1, K_F64, 0)) == NULL)
                  || (args[17] != Py_None && (fit = get(&b, args[17], 1, K_F64, 0)) == NULL))) {
        goto done;
    }
    int got = get_params(&b, args + 18, &p);
    if (got <= 0) {
        result = got < 0 ? NULL : Py_False;
        goto done;
    }
    const Py_ssize_t k = nodes->shape[0], n = cpu_free->shape[0], G = gpu_free->shape[1];
    if (k == 0 || G == 0 || G > MAX_G || mem_free->shape[0] != n || gpu_free->shape[0] != n
        || usable->shape[0] != n || usable->shape[1] != G || node_model->shape[0] != n || vals->shape[0] != n
        || vers->shape[0] != n || version->shape[0] != n || out->shape[0] != k
        || (share && (out->shape[1] != G || elig->shape[0] != k || elig->shape[1] != G)) || milli < 0) {
        goto done;
    }
    const int64_t *at = nodes->buf, *cf = cpu_free->buf, *mf = mem_free->buf, *gf = gpu_free->buf;
    const int64_t *ver = version->buf;
    const char *us = usable->buf, *el = share ? elig->buf : NULL;
    const int model_i32 = kind_of(node_model) == K_I32;
    const Py_ssize_t tl = term ? term->shape[0] : PY_SSIZE_T_MAX, fl = fit ? fit->shape[0] : PY_SSIZE_T_MAX;
    double *vl = vals->buf;
    int64_t *vr = vers->buf;
    /* everything checked before anything is written: the node numbers, each GPU's free milli (and after the share)
       a row of the table (and of term and fit), the models */
    Py_ssize_t n_stale = 0, n_after = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        const int64_t node = at[i];
        if (node < 0 || node >= n) {
            goto done;
        }
        int64_t mi = model_at(node_model->buf, model_i32, node);
        if (mi < -p.M || mi >= p.M) {
            goto done;
        }
        for (Py_ssize_t j = 0; j < G; j++) {
            const int64_t l = us[node * G + j] ? gf[node * G + j] : 0;
            if (l < 0 || l >= p.L || l >= tl || l >= fl) {
                goto done;
            }
            if (share && el[i * G + j]) {
                if (l - milli < 0) {
                    goto done;
                }
                int dup = 0;  /* distinct_placements: one per free milli per node */
                for (Py_ssize_t j2 = 0; j2 < j; j2++) {
                    if (el[i * G + j2] && (us[node * G + j2] ? gf[node * G + j2] : 0) == l) {
                        dup = 1;
                        break;
                    }
                }
                n_after += !dup;
            }
        }
        n_stale += vr[node] != ver[node];
    }
    if (!share) {
        n_after = k;
    }
    double *o = out->buf;
    if (n_after > 0) {
        const int single = n_stale + n_after == 1;
        for (Py_ssize_t i = 0; i < k; i++) {  /* the stale before-states first, as _descent */
            const int64_t node = at[i];
            if (vr[node] == ver[node]) {
                continue;
            }
            for (Py_ssize_t j = 0; j < G; j++) {
                row[j] = us[node * G + j] ? gf[node * G + j] : 0;
            }
            vl[node] = measure_state(&p, cf[node], row, G, mf[node], model_at(node_model->buf, model_i32, node),
                                     single, tmp, sums);
            vr[node] = ver[node];
        }
        for (Py_ssize_t i = 0; i < k; i++) {
            const int64_t node = at[i];
            const int64_t mi = model_at(node_model->buf, model_i32, node);
            const double before = vl[node];
            for (Py_ssize_t j = 0; j < G; j++) {
                row[j] = us[node * G + j] ? gf[node * G + j] : 0;
            }
            if (!share) {
                take_packed(after, row, G, count, milli);
                double d = before - measure_state(&p, cf[node] - r_cpu, after, G, mf[node] - r_mem, mi, single, tmp,
                                                  sums);
                o[i] = quant > 0 ? floor(d / quant) : d;
                continue;
            }
            double *orow = o + i * G;
            for (Py_ssize_t j = 0; j < G; j++) {
                double v = -INFINITY;
                if (el[i * G + j]) {
                    Py_ssize_t j2 = 0;
                    while (j2 < j && !(el[i * G + j2] && row[j2] == row[j])) {
                        j2++;
                    }
                    if (j2 < j) {
                        v = orow[j2];  /* the same after-state's score (written before term and fit below) */
                    }
                    else {
                        memcpy(after, row, G * sizeof(int64_t));
                        after[j] -= milli;
                        double d = before - measure_state(&p, cf[node] - r_cpu, after, G, mf[node] - r_mem, mi,
                                                          single, tmp, sums);
                        v = quant > 0 ? floor(d / quant) : d;
                    }
                }
                orow[j] = v;
            }
        }
    }
    else {
        for (Py_ssize_t x = 0; x < k * G; x++) {
            o[x] = -INFINITY;
        }
    }
    if (share && (term || fit)) {
        const double *tv = term ? term->buf : NULL, *fv = fit ? fit->buf : NULL;
        for (Py_ssize_t i = 0; i < k; i++) {
            const int64_t node = at[i];
            for (Py_ssize_t j = 0; j < G; j++) {
                const int64_t l = us[node * G + j] ? gf[node * G + j] : 0;
                if (tv) {
                    o[i * G + j] += tv[l];
                }
                if (fv) {
                    o[i * G + j] -= fv[l];
                }
            }
        }
    }
    result = Py_True;
done:
    release(&b);
    if (result != NULL) {
        Py_INCREF(result);
    }
    return result;
}

PyDoc_STRVAR(fgd_doc,
"fgd(out, inv, nodes, cpu_free, gpu_free, gpu_usable, node_model, elig, r_cpu, milli, count, access, gpu_shape,\n"
"    table, count_t, cpu_t, freq) -> int\n\n"
"FGD's fragment decreases (frag_amount before less after; the sigmoid stays in numpy) of placing a pod on k nodes\n"
"(nodes [k] int64, rows of the state's columns: cpu_free [n] int64, gpu_free [n, G] int64, gpu_usable [n, G] bool,\n"
"node_model [n] int32/int64), frag_amount's last six arguments as frag_amount()'s.  elig None: per node into out [k]\n"
"(count > 0: take_packed of count GPUs of milli; inv unused), returns k.  elig [k, G] bool (a share of milli; True:\n"
"every usable GPU with milli free, eligible_gpus' mask of a pod with no model, memory or device-slot terms): one per\n"
"distinct placement (per node, per free milli of its eligible GPUs: FragDescent's distinct_placements) into out\n"
"([>= k * G] float64) in the order of the node, then the free milli, and inv [k, G] int64 each GPU's placement (-1\n"
"where not eligible), returns their number.  -1 (nothing written) where an input is of another type or layout or\n"
"out of range: the caller takes the Python path.");

static PyObject *
fgd(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 17) {
        PyErr_SetString(PyExc_TypeError, "fgd() takes 17 arguments");
        return NULL;
    }
    const long long r_cpu = PyLong_AsLongLong(args[8]);
    const long long milli = PyLong_AsLongLong(args[9]);
    const long long count = PyLong_AsLongLong(args[10]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    buffers b = {.n = 0};
    long long result = -1;
    double tmp[MAX_T];
    int64_t sums[2 * MAX_T + 1];
    int64_t row[MAX_G], after[MAX_G];
    const int share = args[7] != Py_None, plain = args[7] == Py_True;

    Py_buffer *out = get(&b, args[0], 1, K_F64, 1);
    Py_buffer *inv = share ? get(&b, args[1], 2, K_I64, 1) : NULL;
    Py_buffer *nodes = get(&b, args[2], 1, K_I64, 0);
    Py_buffer *cpu_free = get(&b, args[3], 1, K_I64, 0);
    Py_buffer *gpu_free = get(&b, args[4], 2, K_I64, 0);
    Py_buffer *usable = get(&b, args[5], 2, K_BOOL, 0);
    Py_buffer *node_model = get(&b, args[6], 1, K_I64 | K_I32, 0);
    Py_buffer *elig = share && !plain ? get(&b, args[7], 2, K_BOOL, 0) : NULL;
    Py_buffer *ok = get(&b, args[11], 2, K_BOOL, 0);
    Py_buffer *shape = get(&b, args[12], 1, K_BOOL, 0);
    Py_buffer *table = get(&b, args[13], 2, K_I64, 0);
    Py_buffer *count_t = get(&b, args[14], 1, K_I64, 0);
    Py_buffer *cpu_t = get(&b, args[15], 1, K_I64 | K_F64, 0);
    Py_buffer *freq = get(&b, args[16], 1, K_F64, 0);
    if (!(out && nodes && cpu_free && gpu_free && usable && node_model && ok && shape && table && count_t && cpu_t
          && freq) || (share && !(inv && (plain || elig)))) {
        goto done;
    }
    const Py_ssize_t k = nodes->shape[0], n = cpu_free->shape[0], G = gpu_free->shape[1], T = count_t->shape[0];
    const Py_ssize_t L = table->shape[0], C = table->shape[1], M = ok->shape[0];
    if (k == 0 || G == 0 || G > MAX_G || T == 0 || T > MAX_T || C != 2 * T + 1 || ok->shape[1] != T
        || shape->shape[0] != T || cpu_t->shape[0] != T || freq->shape[0] != T || gpu_free->shape[0] != n
        || usable->shape[0] != n || usable->shape[1] != G || node_model->shape[0] != n || milli < 0
        || out->shape[0] < (share ? k * G : k)
        || (share && (inv->shape[0] != k || inv->shape[1] != G))
        || (elig && (elig->shape[0] != k || elig->shape[1] != G))) {
        goto done;
    }
    const int64_t *at = nodes->buf, *cf = cpu_free->buf, *gf = gpu_free->buf;
    const char *us = usable->buf, *el = elig ? elig->buf : NULL;
/* GPU j of the i-th node (row node) takes the share: the mask given, or usable with the share's milli free */
#define ELIG(i, node, j) (el ? el[(i) * G + (j)] : (us[(node) * G + (j)] && gf[(node) * G + (j)] >= milli))
    const int model_i32 = kind_of(node_model) == K_I32, cpu_t_f = kind_of(cpu_t) == K_F64;
    /* everything checked before anything is written: the node numbers, each GPU's free milli (and after the share)
       a row of the table, the models */
    for (Py_ssize_t i = 0; i < k; i++) {
        const int64_t node = at[i];
        if (node < 0 || node >= n) {
            goto done;
        }
        const int64_t mi = model_at(node_model->buf, model_i32, node);
        if (mi < -M || mi >= M) {
            goto done;
        }
        for (Py_ssize_t j = 0; j < G; j++) {
            const int64_t l = us[node * G + j] ? gf[node * G + j] : 0;
            if (l < 0 || l >= L || (share && ELIG(i, node, j) && l - milli < 0)) {
                goto done;
            }
        }
    }
    double *o = out->buf;
    int64_t *iv = share ? inv->buf : NULL;
    Py_ssize_t p = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        const int64_t node = at[i];
        const char *okr = ok_row(ok->buf, node_model->buf, model_i32, node, M, T);
        for (Py_ssize_t j = 0; j < G; j++) {
            row[j] = us[node * G + j] ? gf[node * G + j] : 0;
        }
        if (share) {
            int any = 0;
            for (Py_ssize_t j = 0; j < G; j++) {
                iv[i * G + j] = -1;
                any |= ELIG(i, node, j);
            }
            if (!any) {
                continue;
            }
        }
        sum_rows(sums, table->buf, C, row, G);
        const double before = frag_of(sums, sums[0], T, okr, shape->buf, count_t->buf, cpu_t->buf, cpu_t_f, cf[node],
                                      freq->buf, tmp);
        if (!share) {
            take_packed(after, row, G, count, milli);
            sum_rows(sums, table->buf, C, after, G);
            o[i] = before - frag_of(sums, sums[0], T, okr, shape->buf, count_t->buf, cpu_t->buf, cpu_t_f,
                                    cf[node] - r_cpu, freq->buf, tmp);
            continue;
        }
        /* the node's distinct free milli among its eligible GPUs, ascending (distinct_placements' sorted keys), each
           placed on its first GPU */
        for (;;) {
            Py_ssize_t best = -1;
            for (Py_ssize_t j = 0; j < G; j++) {
                if (ELIG(i, node, j) && iv[i * G + j] < 0 && (best < 0 || row[j] < row[best])) {
                    best = j;
                }
            }
            if (best < 0) {
                break;
            }
            for (Py_ssize_t j = best; j < G; j++) {
                if (ELIG(i, node, j) && row[j] == row[best]) {
                    iv[i * G + j] = p;
                }
            }
            memcpy(after, row, G * sizeof(int64_t));
            after[best] -= milli;
            sum_rows(sums, table->buf, C, after, G);
            o[p++] = before - frag_of(sums, sums[0], T, okr, shape->buf, count_t->buf, cpu_t->buf, cpu_t_f,
                                      cf[node] - r_cpu, freq->buf, tmp);
        }
    }
    result = share ? (long long)p : (long long)k;
done:
    release(&b);
    return PyLong_FromLongLong(result);
}
#undef ELIG

/* fit's per-node first rejection (0 passed, 1 no pod slot, 2 cpu, 3 memory, 4 GPU figure), without branches (the
   loop unswitched on with_pods and with_fig; pf and fg unread where 0).  Baseline x86-64 (SSE2) has no 64-bit integer
   compare, so gcc also builds an AVX2 clone, picked at load time where the CPU has it (as numpy dispatches its own
   compares); other compilers and targets build the one function. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
__attribute__((target_clones("avx2", "default")))
#endif
static void
fit_codes(unsigned char *restrict codes, const int64_t *restrict cf, const int64_t *restrict mf,
          const int64_t *restrict pf, const int64_t *restrict fg, int64_t cpu, int64_t mem, int64_t need,
          Py_ssize_t n, int with_pods, int with_fig)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = with_fig ? (unsigned char)((fg[i] < need) * 4) : 0;
        c = mf[i] < mem ? 3 : c;
        c = cf[i] < cpu ? 2 : c;
        if (with_pods) {
            c = pf[i] < 1 ? 1 : c;
        }
        codes[i] = c;
    }
}

PyDoc_STRVAR(fit_doc,
"fit(cpu_free, mem_free, pods_free, fig, cpu, mem, need, ok, codes, cand) -> (passed, by_fit, by_gpu) or None\n\n"
"A plain pod's filter phase over every node in one pass: NodeResourcesFit (cpu_free >= cpu, mem_free >= mem and,\n"
"where pods_free is not None, pods_free >= 1) then GpuFit's plain verdict (fig >= need; fig None: GpuFit passes\n"
"all).  Writes ok[i] (bool), codes[i] (a bytearray: 0 passed, 1 no pod slot, 2 too little cpu, 3 too little\n"
"memory, 4 turned away by GpuFit alone) and the passing nodes' positions into cand[0:passed] (int64); returns how\n"
"many passed and how many each filter turned away, or None (writing nothing) where an input is not of the types,\n"
"shapes or range it handles.");

/* The engine's filter phase for a pod with no terms, claims or scalars (framework.Scheduler._filter's fused path):
   the two filters' compares, the framework's newly-rejected masks, the feasible mask and its nonzero, a dozen numpy
   calls over every node, as one pass; each node's first rejection kept as a byte for a later diagnosis. */
static PyObject *
fit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "fit takes 10 arguments");
        return NULL;
    }
    long long cpu = PyLong_AsLongLong(args[4]);
    long long mem = cpu == -1 && PyErr_Occurred() ? 0 : PyLong_AsLongLong(args[5]);
    long long need = PyErr_Occurred() ? 0 : PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) {  /* not an int, or beyond int64: the numpy path */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    buffers b = {.n = 0};
    PyObject *result = Py_None;
    Py_buffer *vc = get(&b, args[0], 1, K_I64, 0);
    Py_buffer *vm = vc ? get(&b, args[1], 1, K_I64, 0) : NULL;
    Py_buffer *vp = NULL, *vf = NULL, *vo = NULL, *vk = NULL, *vn = NULL;
    if (vm == NULL) {
        goto done;
    }
    Py_ssize_t n = vc->shape[0];
    if (vm->shape[0] != n) {
        goto done;
    }
    if (args[2] != Py_None && ((vp = get(&b, args[2], 1, K_I64, 0)) == NULL || vp->shape[0] != n)) {
        goto done;
    }
    if (args[3] != Py_None && ((vf = get(&b, args[3], 1, K_I64, 0)) == NULL || vf->shape[0] != n)) {
        goto done;
    }
    if ((vo = get(&b, args[7], 1, K_BOOL, 1)) == NULL || vo->shape[0] != n) {
        goto done;
    }
    if (b.n >= NBUF || PyObject_GetBuffer(args[8], &b.v[b.n], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyErr_Clear();
        goto done;
    }
    vk = &b.v[b.n++];
    if (vk->len != n) {
        goto done;
    }
    if ((vn = get(&b, args[9], 1, K_I64, 1)) == NULL || vn->shape[0] != n) {
        goto done;
    }
    {
        const int64_t *cf = vc->buf, *mf = vm->buf;
        const int64_t *pf = vp ? vp->buf : NULL, *fg = vf ? vf->buf : NULL;
        char *ok = vo->buf;
        unsigned char *codes = vk->buf;
        int64_t *cand = vn->buf;
        Py_ssize_t passed = 0, by_fit = 0, by_gpu = 0;
        /* branch-free, in four variants (pod-slot column, GPU figure, each present or not), so that the compiler
           vectorises the codes as numpy does its compares; then the candidates by a branch-free compaction */
        if (pf && fg) {
            fit_codes(codes, cf, mf, pf, fg, cpu, mem, need, n, 1, 1);
        }
        else if (pf) {
            fit_codes(codes, cf, mf, pf, cf, cpu, mem, need, n, 1, 0);
        }
        else if (fg) {
            fit_codes(codes, cf, mf, cf, fg, cpu, mem, need, n, 0, 1);
        }
        else {
            fit_codes(codes, cf, mf, cf, cf, cpu, mem, need, n, 0, 0);
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            unsigned char c = codes[i];
            ok[i] = c == 0;
            by_gpu += c == 4;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            cand[passed] = i;
            passed += ok[i];
        }
        by_fit = n - passed - by_gpu;
        result = Py_BuildValue("(nnn)", passed, by_fit, by_gpu);
        release(&b);
        return result;
    }
done:
    release(&b);
    Py_INCREF(result);
    return result;
}

PyDoc_STRVAR(top_doc,
"top(scores) -> (ties, first) or None\n\n"
"How many of the float64 scores are within 1e-9 of the largest (scores >= max(scores) - 1e-9) and the position of\n"
"the first; None where scores is not a non-empty float64 vector or holds a NaN (the numpy path then).");

/* framework.Scheduler._pick's maximum, tie mask and nonzero (three numpy calls) as one pass, for the usual cycle
   whose best score is unique. */
static PyObject *
top(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "top takes 1 argument");
        return NULL;
    }
    buffers b = {.n = 0};
    Py_buffer *v = get(&b, args[0], 1, K_F64, 0);
    if (v == NULL || v->shape[0] == 0) {
        release(&b);
        Py_RETURN_NONE;
    }
    const double *s = v->buf;
    Py_ssize_t n = v->shape[0];
    double best = s[0];
    for (Py_ssize_t i = 0; i < n; i++) {
        if (isnan(s[i])) {  /* np.maximum.reduce propagates it: the numpy path */
            release(&b);
            Py_RETURN_NONE;
        }
        if (s[i] > best) {
            best = s[i];
        }
    }
    double thr = best - 1e-9;
    Py_ssize_t ties = 0, first = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s[i] >= thr) {
            if (ties++ == 0) {
                first = i;
            }
        }
    }
    release(&b);
    return Py_BuildValue("(nn)", ties, first);
}

static PyMethodDef methods[] = {
    {"measure", (PyCFunction)(void (*)(void))measure, METH_FASTCALL, measure_doc},
    {"frag_amount", (PyCFunction)(void (*)(void))frag_amount, METH_FASTCALL, frag_amount_doc},
    {"descent", (PyCFunction)(void (*)(void))descent, METH_FASTCALL, descent_doc},
    {"fgd", (PyCFunction)(void (*)(void))fgd, METH_FASTCALL, fgd_doc},
    {"fit", (PyCFunction)(void (*)(void))fit, METH_FASTCALL, fit_doc},
    {"top", (PyCFunction)(void (*)(void))top, METH_FASTCALL, top_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "gpufleet._native",
    "The descent measure and FGD's frag_amount of a few node states in C, the same bits as numpy (see _native.c).",
    -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModule_Create(&module);
}
