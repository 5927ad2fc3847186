/* The SSE scanner of `specproxy.proxy.sse`, compiled: the same state machine as `PySSEScanner`,
 * event for event, with the byte searches done in one pass per event in C instead of one Python
 * call per search.
 *
 * Why compiled: the relay's profile on a streamed chat completion put a quarter of the proxy's CPU
 * in the Python scanner (about ten byte searches and a dozen attribute updates per event, 13
 * events a stream), and per-chunk batching in Python did not help, since each marker still costs
 * a pass over the bytes (docs/performance.md, "Where the CPU goes"). This module is the base
 * class `specproxy.proxy._sse.Scanner`; `sse.SSEScanner` subclasses it and supplies, as methods,
 * the rare steps that parse JSON (`_usage_doc`, `_has_content`, `_raw_value`) or read a
 * multi-line event (`_data_payload`), so those keep exactly one implementation, in Python.
 *
 * Equivalence with `PySSEScanner` is tested on every fixture, chunked down to single bytes, and
 * on generated streams (tests/proxy/test_sse.py).
 */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <Python.h>
#include <string.h>

#define DEFAULT_MAX_EVENT_BYTES (1024 * 1024) /* sse.MAX_EVENT_BYTES: a test holds them equal */

static PyObject *str_data_payload;   /* "_data_payload" */
static PyObject *str_usage_doc;      /* "_usage_doc" */
static PyObject *str_has_content;    /* "_has_content" */
static PyObject *str_raw_value;      /* "_raw_value" */
static PyObject *bytes_empty;        /* b"" */
static PyObject *bytes_join;         /* b"".join */
static PyObject *bytes_fingerprint;  /* b'"system_fingerprint":' */
static PyObject *array_type;         /* array.array */

#define LIT(s) s, (sizeof(s) - 1)

static const char FINGERPRINT[] = "\"system_fingerprint\":";

typedef struct {
    PyObject_HEAD
    int strip;
    Py_ssize_t max_event_bytes;
    int oversized;
    int done;
    int error_event;
    int token_ids_complete;
    int sep_known;
    Py_ssize_t seplen; /* 2: "\n\n", 4: "\r\n\r\n" */
    Py_ssize_t n_events;
    Py_ssize_t token_ids;
    int has_first, has_last_content, has_last_event;
    double first_content_at, last_content_at, last_event_at;
    double *gaps;          /* between consecutive content events: 8 bytes each */
    Py_ssize_t n_gaps, gaps_cap;
    PyObject *usage;       /* dict or NULL */
    PyObject *speculative; /* dict or NULL */
    PyObject *held;        /* list[bytes]: finish events awaiting the usage chunk's fingerprint */
    PyObject *out;         /* list[bytes]: what the client gets from this feed */
    char *buf;             /* an event begun in an earlier chunk */
    Py_ssize_t buf_len, buf_cap, scan_from;
    /* Events passed on verbatim straight from the chunk being fed, not yet in `out`: one run of
     * adjacent bytes of it (`run`, `run_n`), so that they become one bytes object, or the chunk
     * itself when it is all of it, instead of one copy per event joined again. Only while a
     * feed scans its chunk (`chunk` set, borrowed); always flushed into `out` before `out` is
     * read or added to, and before the feed returns. */
    PyObject *chunk;
    const char *chunk_p;
    Py_ssize_t chunk_n;
    const char *run;
    Py_ssize_t run_n;
} Scanner;

static inline const char *sep_of(const Scanner *s) { return s->seplen == 4 ? "\r\n\r\n" : "\n\n"; }

/* The first `needle` in hay[from:n], as memmem. Not memmem alone: glibc's sets up its two-way
 * search on every call (~35 ns), and an event takes a dozen searches of a few hundred bytes
 * (perf: memmem was 3% of the proxy's event loop). memchr (vectorized) for the needle's second
 * byte instead, each candidate then compared whole: the first byte of most needles here is a
 * quote, the commonest byte of JSON; the second is a letter, or the separator's newline. Text
 * full of that byte (a long run of "t"s, say) would make a candidate of every byte: after
 * FIND_MISSES false candidates the rest is memmem's, linear whatever the bytes.
 *
 * `find_k` looks for the needle's byte `k`, chosen per needle as the rarest in vLLM's chunks
 * (counted on the recorded streams of tests/fixtures: per event, `"token_ids":`'s "k" is in 2.1
 * places against its "t"'s 12.5, `"text":`'s "x" in 1.9, `"usage"`'s "g" in 1.2): every
 * candidate is a memchr and a memcmp, and the second bytes made ~49 of them an event, the
 * rarest ~25. Each search names its byte. */
#define FIND_MISSES 64
static inline Py_ssize_t find_k(const char *hay, Py_ssize_t n, const char *needle, Py_ssize_t m,
                                Py_ssize_t from, Py_ssize_t k) {
    if (from < 0) from = 0;
    if (from > n || m > n - from) return -1;
    if (m == 0) return from;
    const char *at = hay + from + k;      /* where it may be: the needle would start at - k */
    const char *last = hay + n - (m - k); /* its last such place: the needle ends at n */
    for (int misses = 0; at <= last; misses++) {
        const char *hit = memchr(at, (unsigned char)needle[k], (size_t)(last - at + 1));
        if (hit == NULL) return -1;
        if (memcmp(hit - k, needle, (size_t)m) == 0) return (Py_ssize_t)(hit - k - hay);
        at = hit + 1;
        if (misses == FIND_MISSES) { /* every start before at - k was ruled out */
            const char *rest = at - k;
            const char *found = memmem(rest, (size_t)(hay + n - rest), needle, (size_t)m);
            return found == NULL ? -1 : (Py_ssize_t)(found - hay);
        }
    }
    return -1;
}

/* `find_k` by the needle's second byte: the first is a quote in most needles here. */
static inline Py_ssize_t find(const char *hay, Py_ssize_t n, const char *needle, Py_ssize_t m,
                              Py_ssize_t from) {
    return find_k(hay, n, needle, m, from, m > 1 ? 1 : 0);
}

static inline int contains(const char *hay, Py_ssize_t n, const char *needle, Py_ssize_t m) {
    return find(hay, n, needle, m, 0) >= 0;
}

/* `contains` by the needle's byte `k` (see `find_k`). */
static inline int contains_k(const char *hay, Py_ssize_t n, const char *needle, Py_ssize_t m,
                             Py_ssize_t k) {
    return find_k(hay, n, needle, m, 0, k) >= 0;
}

static inline int is_ascii_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

/* sse.count_token_ids: -1 for None. */
static Py_ssize_t count_token_ids(const char *p, Py_ssize_t n) {
    static const char KEY[] = "\"token_ids\":";
    const Py_ssize_t klen = sizeof(KEY) - 1;
    Py_ssize_t total = -1;
    Py_ssize_t start = find_k(p, n, KEY, klen, 0, 3); /* "k" */
    while (start >= 0) {
        Py_ssize_t begin = start + klen;
        while (begin < n && p[begin] == ' ') begin++;
        if (begin < n && p[begin] == '[') {
            Py_ssize_t end = find(p, n, "]", 1, begin);
            if (end < 0) return total;
            Py_ssize_t a = begin + 1, b = end;
            while (a < b && is_ascii_space(p[a])) a++;
            while (b > a && is_ascii_space(p[b - 1])) b--;
            Py_ssize_t items = 0;
            if (b > a) {
                items = 1;
                for (Py_ssize_t i = a; i < b; i++) items += p[i] == ',';
            }
            total = (total < 0 ? 0 : total) + items;
            begin = end;
        }
        start = find_k(p, n, KEY, klen, begin, 3);
    }
    return total;
}

/* `"finish_reason":"` or `"finish_reason": "` anywhere (sse._FINISHED): one search for the key,
 * then the bytes after each occurrence. */
static int finished(const char *p, Py_ssize_t n) {
    static const char KEY[] = "\"finish_reason\":";
    const Py_ssize_t klen = sizeof(KEY) - 1;
    Py_ssize_t at = find(p, n, KEY, klen, 0);
    while (at >= 0) {
        Py_ssize_t v = at + klen;
        if (v < n && p[v] == '"') return 1;
        if (v + 1 < n && p[v] == ' ' && p[v + 1] == '"') return 1;
        at = find(p, n, KEY, klen, at + 1);
    }
    return 0;
}

/* sse._MAYBE_EMPTY.search(payload) is not None:
 * `"content": ?(?:""|null)|"text": ?""|"delta": ?\{\}` anywhere. */
static int maybe_empty(const char *p, Py_ssize_t n) {
    static const struct {
        const char *key;
        Py_ssize_t klen;
        const char *v1;
        const char *v2;
        Py_ssize_t rare;
    } forms[] = {
        {LIT("\"content\":"), "\"\"", "null", 1}, /* "c" */
        {LIT("\"text\":"), "\"\"", NULL, 3},      /* "x" */
        {LIT("\"delta\":"), "{}", NULL, 1},        /* "d" */
    };
    for (size_t f = 0; f < sizeof(forms) / sizeof(forms[0]); f++) {
        Py_ssize_t at = find_k(p, n, forms[f].key, forms[f].klen, 0, forms[f].rare);
        while (at >= 0) {
            Py_ssize_t v = at + forms[f].klen;
            for (int space = 0; space < 2; space++) {
                if (space) {
                    if (v < n && p[v] == ' ') v++;
                    else break;
                }
                const char *vals[2] = {forms[f].v1, forms[f].v2};
                for (int i = 0; i < 2; i++) {
                    if (vals[i] == NULL) continue;
                    Py_ssize_t len = (Py_ssize_t)strlen(vals[i]);
                    if (len <= n - v && memcmp(p + v, vals[i], (size_t)len) == 0) return 1;
                }
            }
            at = find_k(p, n, forms[f].key, forms[f].klen, at + 1, forms[f].rare);
        }
    }
    return 0;
}

/* Whether the bytes alone prove what `sse._has_content` would answer False: no backslash (so no
 * string holds a quote and every `"key"` followed by a colon is a key), and every content key,
 * at any depth, holds "", null, [], {} or false. Anything else is left to `_has_content`. */
static int surely_empty(const char *p, Py_ssize_t n) {
    static const struct {
        const char *key;
        Py_ssize_t klen;
        Py_ssize_t rare;
    } keys[] = {
        {LIT("\"content\""), 1},           /* "c" */
        {LIT("\"text\""), 3},              /* "x" */
        {LIT("\"reasoning\""), 8},         /* "g" */
        {LIT("\"reasoning_content\""), 8}, /* "g" */
        {LIT("\"tool_calls\""), 5},        /* "_" */
        {LIT("\"token_ids\""), 3},         /* "k" */
    };
    static const struct {
        const char *v;
        Py_ssize_t len;
    } falsy[] = {{LIT("\"\"")}, {LIT("null")}, {LIT("[]")}, {LIT("{}")}, {LIT("false")}};
    if (memchr(p, '\\', (size_t)n) != NULL) return 0;
    for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
        Py_ssize_t at = find_k(p, n, keys[k].key, keys[k].klen, 0, keys[k].rare);
        while (at >= 0) {
            Py_ssize_t i = at + keys[k].klen;
            while (i < n && is_ascii_space(p[i])) i++;
            if (i < n && p[i] == ':') { /* a key: its value must be falsy */
                i++;
                while (i < n && is_ascii_space(p[i])) i++;
                int ok = 0;
                for (size_t f = 0; f < sizeof(falsy) / sizeof(falsy[0]) && !ok; f++) {
                    ok = falsy[f].len <= n - i && memcmp(p + i, falsy[f].v, (size_t)falsy[f].len) == 0;
                }
                if (!ok) return 0;
            }
            at = find_k(p, n, keys[k].key, keys[k].klen, at + 1, keys[k].rare);
        }
    }
    return 1;
}

/* The `data:` payload of one event body (no trailing blank line), as `sse._data_payload`.
 * Returns 1 with (*p, *pn) set (pointing into `body`, or into *owner), 0 for None, -1 on error. */
static int data_payload(Scanner *s, const char *body, Py_ssize_t n, const char **p, Py_ssize_t *pn,
                        PyObject **owner) {
    *owner = NULL;
    int starts = n >= 5 && memcmp(body, "data:", 5) == 0;
    if (starts && memchr(body, '\n', (size_t)n) == NULL) { /* one `data:` line */
        Py_ssize_t skip = (n > 5 && body[5] == ' ') ? 6 : 5;
        *p = body + skip;
        *pn = n - skip;
        return 1;
    }
    if (!starts && !contains(body, n, "data:", 5)) return 0;
    PyObject *arg = PyBytes_FromStringAndSize(body, n);
    if (arg == NULL) return -1;
    PyObject *res = PyObject_CallMethodOneArg((PyObject *)s, str_data_payload, arg);
    Py_DECREF(arg);
    if (res == NULL) return -1;
    if (res == Py_None) {
        Py_DECREF(res);
        return 0;
    }
    if (!PyBytes_Check(res)) {
        Py_DECREF(res);
        PyErr_SetString(PyExc_TypeError, "_data_payload must return bytes or None");
        return -1;
    }
    *owner = res;
    *p = PyBytes_AS_STRING(res);
    *pn = PyBytes_GET_SIZE(res);
    return 1;
}

/* The pending run into `out` (see Scanner.run). */
static int flush_run(Scanner *s) {
    if (s->run_n == 0) return 0;
    PyObject *piece;
    if (s->run == s->chunk_p && s->run_n == s->chunk_n && s->chunk != NULL &&
        PyBytes_CheckExact(s->chunk)) {
        piece = Py_NewRef(s->chunk); /* the whole chunk, as it came */
    } else {
        piece = PyBytes_FromStringAndSize(s->run, s->run_n);
        if (piece == NULL) return -1;
    }
    s->run = NULL;
    s->run_n = 0;
    int rc = PyList_Append(s->out, piece);
    Py_DECREF(piece);
    return rc;
}

static int emit(Scanner *s, PyObject *event) {
    if (flush_run(s) < 0) return -1;
    if (PyList_GET_SIZE(s->held)) {
        Py_ssize_t k = PyList_GET_SIZE(s->held);
        for (Py_ssize_t i = 0; i < k; i++) {
            if (PyList_Append(s->out, PyList_GET_ITEM(s->held, i)) < 0) return -1;
        }
        if (PyList_SetSlice(s->held, 0, k, NULL) < 0) return -1;
    }
    return PyList_Append(s->out, event);
}

static int emit_raw(Scanner *s, const char *ev, Py_ssize_t n) {
    if (s->chunk != NULL && PyList_GET_SIZE(s->held) == 0) { /* verbatim from the chunk */
        if (s->run_n && s->run + s->run_n == ev) {
            s->run_n += n;
            return 0;
        }
        if (flush_run(s) < 0) return -1;
        s->run = ev;
        s->run_n = n;
        return 0;
    }
    PyObject *event = PyBytes_FromStringAndSize(ev, n);
    if (event == NULL) return -1;
    int rc = emit(s, event);
    Py_DECREF(event);
    return rc;
}

/* `sse._raw_value(payload, FINGERPRINT)` where the bytes alone decide it: an ASCII payload whose
 * fingerprint is a string of printable ASCII without escapes (vLLM's "vllm-0.32.0-6d623c34"):
 * the string's JSON text, quotes included. NULL with no exception set: anything else, left to
 * the Python hook (which also raises what it raises on a payload that is not UTF-8). */
static PyObject *plain_fingerprint(const char *p, Py_ssize_t n) {
    const Py_ssize_t keyn = (Py_ssize_t)sizeof(FINGERPRINT) - 1;
    Py_ssize_t at = find_k(p, n, FINGERPRINT, keyn, 0, 2); /* "y" */
    if (at < 0) return NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if ((unsigned char)p[i] >= 0x80) return NULL;
    Py_ssize_t begin = at + keyn;
    while (begin < n && p[begin] == ' ') begin++;
    if (begin >= n || p[begin] != '"') return NULL;
    for (Py_ssize_t i = begin + 1; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '"') return PyBytes_FromStringAndSize(p + begin, i + 1 - begin);
        if (c == '\\' || c < 0x20 || c == 0x7f) return NULL;
    }
    return NULL;
}

/* The usage chunk (`choices: []` plus `usage`), as `PySSEScanner._usage_event`: 1 if it was one,
 * 0 if not, -1 on error. */
static int usage_event(Scanner *s, const char *ev, Py_ssize_t evn, const char *p, Py_ssize_t pn) {
    PyObject *payload = PyBytes_FromStringAndSize(p, pn);
    if (payload == NULL) return -1;
    PyObject *doc = PyObject_CallMethodOneArg((PyObject *)s, str_usage_doc, payload);
    if (doc == NULL) {
        Py_DECREF(payload);
        return -1;
    }
    if (doc == Py_None) {
        Py_DECREF(doc);
        Py_DECREF(payload);
        return 0;
    }
    if (!PyTuple_Check(doc) || PyTuple_GET_SIZE(doc) != 2) {
        Py_DECREF(doc);
        Py_DECREF(payload);
        PyErr_SetString(PyExc_TypeError, "_usage_doc must return (usage, speculative) or None");
        return -1;
    }
    PyObject *usage = PyTuple_GET_ITEM(doc, 0), *spec = PyTuple_GET_ITEM(doc, 1);
    Py_INCREF(usage);
    Py_XSETREF(s->usage, usage);
    if (spec != Py_None) {
        Py_INCREF(spec);
        Py_XSETREF(s->speculative, spec);
    }
    Py_DECREF(doc);
    if (!s->strip) {
        Py_DECREF(payload);
        return 1;
    }
    PyObject *fp = plain_fingerprint(p, pn);
    if (fp == NULL && !PyErr_Occurred())
        fp = PyObject_CallMethodObjArgs((PyObject *)s, str_raw_value, payload, bytes_fingerprint,
                                        NULL);
    Py_DECREF(payload);
    if (fp == NULL) return -1;
    if (fp != Py_None && !PyBytes_Check(fp)) {
        Py_DECREF(fp);
        PyErr_SetString(PyExc_TypeError, "_raw_value must return bytes or None");
        return -1;
    }
    if (flush_run(s) < 0) goto fail;
    Py_ssize_t k = PyList_GET_SIZE(s->held);
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *held = PyList_GET_ITEM(s->held, i);
        if (fp == Py_None) {
            if (PyList_Append(s->out, held) < 0) goto fail;
            continue;
        }
        const char *h = PyBytes_AS_STRING(held);
        Py_ssize_t hn = PyBytes_GET_SIZE(held), brace = hn - 1;
        while (brace >= 0 && h[brace] != '}') brace--;
        if (brace < 0) brace = hn - 1; /* held[:-1] + ... + held[-1:], as Python slices */
        Py_ssize_t fpn = PyBytes_GET_SIZE(fp), keyn = (Py_ssize_t)sizeof(FINGERPRINT) - 1;
        PyObject *joined = PyBytes_FromStringAndSize(NULL, hn + 1 + keyn + fpn);
        if (joined == NULL) goto fail;
        char *w = PyBytes_AS_STRING(joined);
        memcpy(w, h, (size_t)brace);
        w += brace;
        *w++ = ',';
        memcpy(w, FINGERPRINT, (size_t)keyn);
        w += keyn;
        memcpy(w, PyBytes_AS_STRING(fp), (size_t)fpn);
        w += fpn;
        memcpy(w, h + brace, (size_t)(hn - brace));
        int rc = PyList_Append(s->out, joined);
        Py_DECREF(joined);
        if (rc < 0) goto fail;
    }
    Py_DECREF(fp);
    if (PyList_SetSlice(s->held, 0, k, NULL) < 0) return -1;
    (void)ev;
    (void)evn;
    return 1;
fail:
    Py_DECREF(fp);
    return -1;
}

/* One event, separator included: `PySSEScanner._event`. */
static int scan_event(Scanner *s, const char *ev, Py_ssize_t evn, double now) {
    s->last_event_at = now;
    s->has_last_event = 1;
    const Py_ssize_t body_end = evn - s->seplen;
    const char *p;
    Py_ssize_t pn;
    PyObject *owner;
    int found = data_payload(s, ev, body_end, &p, &pn, &owner);
    if (found < 0) return -1;
    int rc = 0;
    if (!found) {
        return s->strip ? emit_raw(s, ev, evn) : 0;
    }
    if (pn == 6 && memcmp(p, "[DONE]", 6) == 0) {
        s->done = 1;
        rc = s->strip ? emit_raw(s, ev, evn) : 0;
        goto end;
    }
    if (contains_k(p, pn, LIT("\"usage\""), 5)) { /* "g" */
        int used = usage_event(s, ev, evn, p, pn);
        if (used != 0) {
            rc = used < 0 ? -1 : 0;
            goto end;
        }
    }
    if (pn >= 8 && memcmp(p, "{\"error\"", 8) == 0) {
        s->error_event = 1;
        rc = s->strip ? emit_raw(s, ev, evn) : 0;
        goto end;
    }
    Py_ssize_t tokens = count_token_ids(p, pn); /* -1 (None) without the key: one search */
    if (tokens < 0) s->token_ids_complete = 0;
    int content = tokens > 0 || !maybe_empty(p, pn);
    if (!content && !surely_empty(p, pn)) {
        PyObject *arg = PyBytes_FromStringAndSize(p, pn);
        if (arg == NULL) {
            rc = -1;
            goto end;
        }
        PyObject *res = PyObject_CallMethodOneArg((PyObject *)s, str_has_content, arg);
        Py_DECREF(arg);
        if (res == NULL) {
            rc = -1;
            goto end;
        }
        content = PyObject_IsTrue(res);
        Py_DECREF(res);
        if (content < 0) {
            rc = -1;
            goto end;
        }
    }
    if (content) {
        if (!s->has_last_content) {
            s->first_content_at = now;
            s->has_first = 1;
        } else {
            if (s->n_gaps == s->gaps_cap) {
                Py_ssize_t cap = s->gaps_cap ? 2 * s->gaps_cap : 32;
                double *grown = PyMem_Realloc(s->gaps, (size_t)cap * sizeof(double));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    rc = -1;
                    goto end;
                }
                s->gaps = grown;
                s->gaps_cap = cap;
            }
            s->gaps[s->n_gaps++] = now - s->last_content_at;
        }
        s->last_content_at = now;
        s->has_last_content = 1;
        s->n_events++;
        if (tokens > 0) s->token_ids += tokens;
    }
    if (!s->strip) goto end;
    if (finished(p, pn) &&
        !contains_k(p, pn, FINGERPRINT, (Py_ssize_t)sizeof(FINGERPRINT) - 1, 2)) { /* y */
        PyObject *event = PyBytes_FromStringAndSize(ev, evn);
        if (event == NULL || PyList_Append(s->held, event) < 0) rc = -1;
        Py_XDECREF(event);
    } else {
        rc = emit_raw(s, ev, evn);
    }
end:
    Py_XDECREF(owner);
    return rc;
}

static int buf_append(Scanner *s, const char *data, Py_ssize_t n) {
    if (n <= 0) return 0;
    if (s->buf_len + n > s->buf_cap) {
        Py_ssize_t cap = s->buf_cap ? s->buf_cap : 1024;
        while (cap < s->buf_len + n) cap *= 2;
        char *grown = PyMem_Realloc(s->buf, (size_t)cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->buf = grown;
        s->buf_cap = cap;
    }
    memcpy(s->buf + s->buf_len, data, (size_t)n);
    s->buf_len += n;
    return 0;
}

static void buf_release(Scanner *s) {
    s->buf_len = 0;
    if (s->buf_cap > 64 * 1024) { /* do not keep an oversized event's buffer */
        PyMem_Free(s->buf);
        s->buf = NULL;
        s->buf_cap = 0;
    }
}

static PyObject *take_out(Scanner *s) {
    if (flush_run(s) < 0) return NULL;
    Py_ssize_t k = PyList_GET_SIZE(s->out);
    PyObject *res;
    if (k == 0) {
        res = Py_NewRef(bytes_empty);
    } else if (k == 1) {
        res = Py_NewRef(PyList_GET_ITEM(s->out, 0));
    } else {
        res = PyObject_CallOneArg(bytes_join, s->out);
        if (res == NULL) return NULL;
    }
    if (PyList_SetSlice(s->out, 0, k, NULL) < 0) {
        Py_DECREF(res);
        return NULL;
    }
    return res;
}

static PyObject *Scanner_feed(Scanner *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "feed(chunk, now) takes 2 arguments");
        return NULL;
    }
    PyObject *chunk = args[0];
    double now = PyFloat_AsDouble(args[1]);
    if (now == -1.0 && PyErr_Occurred()) return NULL;
    if (s->oversized) return Py_NewRef(s->strip ? bytes_empty : chunk);
    Py_buffer view;
    if (PyObject_GetBuffer(chunk, &view, PyBUF_SIMPLE) < 0) return NULL;
    const char *data = view.buf;
    Py_ssize_t n = view.len;
    if (!s->sep_known) {
        const char *nl = memchr(data, '\n', (size_t)n);
        if (nl != NULL) {
            s->sep_known = 1;
            if (nl > data && nl[-1] == '\r') s->seplen = 4;
        }
    }
    const char *sep = sep_of(s);
    const Py_ssize_t sn = s->seplen;
    if (s->buf_len) { /* an event began in an earlier chunk: scan on in the buffer */
        if (buf_append(s, data, n) < 0) goto error;
        Py_ssize_t start = 0, end = find(s->buf, s->buf_len, sep, sn, s->scan_from);
        while (end >= 0) {
            Py_ssize_t stop = end + sn;
            if (scan_event(s, s->buf + start, stop - start, now) < 0) goto error;
            start = stop;
            end = find(s->buf, s->buf_len, sep, sn, start);
        }
        if (start) {
            memmove(s->buf, s->buf + start, (size_t)(s->buf_len - start));
            s->buf_len -= start;
        }
    } else { /* the usual case: events straight from the chunk */
        s->chunk = chunk;
        s->chunk_p = data;
        s->chunk_n = n;
        Py_ssize_t start = 0, end = find(data, n, sep, sn, 0);
        while (end >= 0) {
            Py_ssize_t stop = end + sn;
            if (scan_event(s, data + start, stop - start, now) < 0) goto error;
            start = stop;
            end = find(data, n, sep, sn, start);
        }
        if (flush_run(s) < 0) goto error; /* while the chunk's bytes are ours to read */
        s->chunk = NULL;
        if (start < n && buf_append(s, data + start, n - start) < 0) goto error;
    }
    PyBuffer_Release(&view);
    s->scan_from = s->buf_len >= sn ? s->buf_len - sn + 1 : 0;
    if (s->buf_len > s->max_event_bytes) { /* the open event is dropped, never parsed */
        s->oversized = 1;
        buf_release(s);
        s->scan_from = 0;
    }
    if (!s->strip) return Py_NewRef(chunk);
    return take_out(s);
error:
    s->chunk = NULL; /* nothing may point into the chunk past this call */
    s->run = NULL;
    s->run_n = 0;
    PyBuffer_Release(&view);
    return NULL;
}

static PyObject *Scanner_finish(Scanner *s, PyObject *Py_UNUSED(ignored)) {
    if (!s->done) {
        Py_ssize_t n = s->buf_len;
        while (n > 0 && (s->buf[n - 1] == '\r' || s->buf[n - 1] == '\n')) n--;
        const char *p;
        Py_ssize_t pn;
        PyObject *owner;
        int found = data_payload(s, s->buf ? s->buf : "", n, &p, &pn, &owner);
        if (found < 0) return NULL;
        if (found && pn == 6 && memcmp(p, "[DONE]", 6) == 0) s->done = 1;
        Py_XDECREF(owner);
    }
    PyObject *res = NULL;
    if (s->strip) {
        Py_ssize_t k = PyList_GET_SIZE(s->held);
        for (Py_ssize_t i = 0; i < k; i++) {
            if (PyList_Append(s->out, PyList_GET_ITEM(s->held, i)) < 0) return NULL;
        }
        if (s->buf_len) {
            PyObject *tail = PyBytes_FromStringAndSize(s->buf, s->buf_len);
            if (tail == NULL) return NULL;
            int rc = PyList_Append(s->out, tail);
            Py_DECREF(tail);
            if (rc < 0) return NULL;
        }
        res = take_out(s);
        if (res == NULL) return NULL;
    } else {
        res = Py_NewRef(bytes_empty);
        if (PyList_SetSlice(s->out, 0, PyList_GET_SIZE(s->out), NULL) < 0) goto fail;
    }
    if (PyList_SetSlice(s->held, 0, PyList_GET_SIZE(s->held), NULL) < 0) goto fail;
    buf_release(s);
    s->scan_from = 0;
    return res;
fail:
    Py_DECREF(res);
    return NULL;
}

static int Scanner_init(Scanner *s, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"strip_usage", "max_event_bytes", NULL};
    int strip = 0;
    Py_ssize_t max_event = DEFAULT_MAX_EVENT_BYTES;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$pn", kwlist, &strip, &max_event)) return -1;
    s->strip = strip;
    s->max_event_bytes = max_event;
    s->token_ids_complete = 1;
    s->seplen = 2;
    if (s->held == NULL && (s->held = PyList_New(0)) == NULL) return -1;
    if (s->out == NULL && (s->out = PyList_New(0)) == NULL) return -1;
    return 0;
}

static int Scanner_traverse(Scanner *s, visitproc visit, void *arg) {
    Py_VISIT(Py_TYPE(s));
    Py_VISIT(s->usage);
    Py_VISIT(s->speculative);
    Py_VISIT(s->held);
    Py_VISIT(s->out);
    return 0;
}

static int Scanner_clear(Scanner *s) {
    Py_CLEAR(s->usage);
    Py_CLEAR(s->speculative);
    Py_CLEAR(s->held);
    Py_CLEAR(s->out);
    return 0;
}

static void Scanner_dealloc(Scanner *s) {
    PyTypeObject *tp = Py_TYPE(s);
    PyObject_GC_UnTrack(s);
    Scanner_clear(s);
    PyMem_Free(s->buf);
    PyMem_Free(s->gaps);
    tp->tp_free((PyObject *)s);
    Py_DECREF(tp);
}

static PyObject *time_or_none(int has, double t) {
    return has ? PyFloat_FromDouble(t) : Py_NewRef(Py_None);
}

static PyObject *get_first_content_at(Scanner *s, void *c) { return time_or_none(s->has_first, s->first_content_at); }
static PyObject *get_last_content_at(Scanner *s, void *c) { return time_or_none(s->has_last_content, s->last_content_at); }
static PyObject *get_last_event_at(Scanner *s, void *c) { return time_or_none(s->has_last_event, s->last_event_at); }
static PyObject *get_n_events(Scanner *s, void *c) { return PyLong_FromSsize_t(s->n_events); }
static PyObject *get_token_ids(Scanner *s, void *c) { return PyLong_FromSsize_t(s->token_ids); }
static PyObject *get_token_ids_complete(Scanner *s, void *c) { return PyBool_FromLong(s->token_ids_complete); }
static PyObject *get_done(Scanner *s, void *c) { return PyBool_FromLong(s->done); }
static PyObject *get_error_event(Scanner *s, void *c) { return PyBool_FromLong(s->error_event); }
static PyObject *get_oversized(Scanner *s, void *c) { return PyBool_FromLong(s->oversized); }
static PyObject *get_strip_usage(Scanner *s, void *c) { return PyBool_FromLong(s->strip); }
static PyObject *get_max_event_bytes(Scanner *s, void *c) { return PyLong_FromSsize_t(s->max_event_bytes); }
static PyObject *get_gaps(Scanner *s, void *c) {
    return PyObject_CallFunction(array_type, "sy#", "d", s->gaps ? (const char *)s->gaps : "",
                                 (Py_ssize_t)(s->n_gaps * (Py_ssize_t)sizeof(double)));
}
static PyObject *get_usage(Scanner *s, void *c) { return Py_NewRef(s->usage ? s->usage : Py_None); }
static PyObject *get_speculative(Scanner *s, void *c) { return Py_NewRef(s->speculative ? s->speculative : Py_None); }
static PyObject *get_buf(Scanner *s, void *c) { return PyBytes_FromStringAndSize(s->buf ? s->buf : "", s->buf_len); }

static PyGetSetDef Scanner_getset[] = {
    {"first_content_at", (getter)get_first_content_at, NULL, "arrival of the first content event", NULL},
    {"last_content_at", (getter)get_last_content_at, NULL, "arrival of the last content event", NULL},
    {"last_event_at", (getter)get_last_event_at, NULL, "arrival of the last event", NULL},
    {"n_events", (getter)get_n_events, NULL, "events with content", NULL},
    {"token_ids", (getter)get_token_ids, NULL, "sum of the content events' token_ids lists", NULL},
    {"token_ids_complete", (getter)get_token_ids_complete, NULL, "every content event carried token_ids", NULL},
    {"done", (getter)get_done, NULL, "data: [DONE] was seen", NULL},
    {"error_event", (getter)get_error_event, NULL, "an in-stream error object was seen", NULL},
    {"oversized", (getter)get_oversized, NULL, "an event outgrew max_event_bytes", NULL},
    {"strip_usage", (getter)get_strip_usage, NULL, "the usage chunk is removed", NULL},
    {"max_event_bytes", (getter)get_max_event_bytes, NULL, "the bound on one event", NULL},
    {"gaps", (getter)get_gaps, NULL, "gaps between consecutive content events (a copy, array('d'))", NULL},
    {"usage", (getter)get_usage, NULL, "the usage chunk's usage", NULL},
    {"speculative", (getter)get_speculative, NULL, "its metrics.speculative_decoding", NULL},
    {"_buf", (getter)get_buf, NULL, "the open event's bytes", NULL},
    {NULL},
};

static PyMethodDef Scanner_methods[] = {
    {"feed", (PyCFunction)(void (*)(void))Scanner_feed, METH_FASTCALL,
     "feed(chunk, now) -> bytes: scan one chunk; return what the client gets"},
    {"finish", (PyCFunction)Scanner_finish, METH_NOARGS,
     "finish() -> bytes: release held events and any incomplete tail verbatim"},
    {NULL},
};

static PyType_Slot Scanner_slots[] = {
    {Py_tp_doc, "The compiled core of sse.SSEScanner (subclass it; see specproxy.proxy.sse)."},
    {Py_tp_init, Scanner_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, Scanner_dealloc},
    {Py_tp_traverse, Scanner_traverse},
    {Py_tp_clear, Scanner_clear},
    {Py_tp_methods, Scanner_methods},
    {Py_tp_getset, Scanner_getset},
    {0, NULL},
};

static PyType_Spec Scanner_spec = {
    .name = "specproxy.proxy._sse.Scanner",
    .basicsize = sizeof(Scanner),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = Scanner_slots,
};

static int module_exec(PyObject *m) {
    if ((str_data_payload = PyUnicode_InternFromString("_data_payload")) == NULL) return -1;
    if ((str_usage_doc = PyUnicode_InternFromString("_usage_doc")) == NULL) return -1;
    if ((str_has_content = PyUnicode_InternFromString("_has_content")) == NULL) return -1;
    if ((str_raw_value = PyUnicode_InternFromString("_raw_value")) == NULL) return -1;
    if ((bytes_empty = PyBytes_FromStringAndSize(NULL, 0)) == NULL) return -1;
    if ((bytes_join = PyObject_GetAttrString(bytes_empty, "join")) == NULL) return -1;
    if ((bytes_fingerprint = PyBytes_FromString(FINGERPRINT)) == NULL) return -1;
    PyObject *array_module = PyImport_ImportModule("array");
    if (array_module == NULL) return -1;
    array_type = PyObject_GetAttrString(array_module, "array");
    Py_DECREF(array_module);
    if (array_type == NULL) return -1;
    PyObject *type = PyType_FromModuleAndSpec(m, &Scanner_spec, NULL);
    if (type == NULL) return -1;
    if (PyModule_AddObject(m, "Scanner", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    if (PyModule_AddIntConstant(m, "DEFAULT_MAX_EVENT_BYTES", DEFAULT_MAX_EVENT_BYTES) < 0) return -1;
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "specproxy.proxy._sse",
    .m_doc = "The compiled core of specproxy.proxy.sse.SSEScanner.",
    .m_size = 0,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__sse(void) { return PyModuleDef_Init(&module_def); }
