/* `usage._object_after`, compiled for the JSON it meets: the object after the last `key` in a
 * body, decoded in C when it is plain JSON (ASCII strings without escapes, numbers, true, false,
 * null, and arrays and objects of those, a few levels deep). Anything else, and any JSON it
 * finds wrong, it hands back to the Python reference (`FALLBACK`), which decodes it with the
 * json module exactly as before, so the result is the reference's on every input.
 *
 * Why compiled: every streamed request ends with vLLM's usage chunk and every non-stream body
 * carries usage; reading `usage` and `metrics.speculative_decoding` (a slice, a decode to str and
 * json's raw_decode, twice) was about 3 us a request in a tight loop, more inside the proxy. Here
 * it is one pass over the object's bytes and the dict it makes.
 *
 * Equivalence with the reference is tested on every fixture and on generated objects
 * (tests/proxy/test_usage.py).
 */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memrchr */
#endif
#include <Python.h>
#include <string.h>

/* The outcomes, as `usage._object_after` names them. */
enum { NOT_FOUND = 0, UNSURE = 1, VALUE = 2, FALLBACK = 3 };

#define MAX_DEPTH 4      /* deeper: the reference decodes it */
#define MAX_NUMBER 40    /* longer numbers: the reference decodes them */

typedef struct {
    const char *p;
    const char *end;
    int depth;
} Cursor;

static inline void skip_ws(Cursor *c) { /* JSON's whitespace */
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

/* Each returns a new reference, or NULL with no exception set for "leave it to the reference"
 * (or with one set on a real error, e.g. memory). */
static PyObject *value(Cursor *c);

static PyObject *plain_string(Cursor *c) { /* at the opening quote */
    const char *start = ++c->p;
    while (c->p < c->end) {
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '"') {
            PyObject *s = PyUnicode_DecodeASCII(start, c->p - start, NULL);
            c->p++;
            return s;
        }
        if (ch == '\\' || ch < 0x20 || ch >= 0x80) return NULL; /* escapes, controls, non-ASCII */
        c->p++;
    }
    return NULL;
}

static PyObject *number(Cursor *c) {
    const char *start = c->p;
    int is_float = 0;
    if (c->p < c->end && *c->p == '-') c->p++;
    if (c->p >= c->end) return NULL;
    if (*c->p == '0') {
        c->p++;
    } else if (*c->p >= '1' && *c->p <= '9') {
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
    } else {
        return NULL; /* -Infinity and the like */
    }
    if (c->p < c->end && *c->p == '.') {
        is_float = 1;
        c->p++;
        const char *digits = c->p;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
        if (c->p == digits) return NULL;
    }
    if (c->p < c->end && (*c->p == 'e' || *c->p == 'E')) {
        is_float = 1;
        c->p++;
        if (c->p < c->end && (*c->p == '+' || *c->p == '-')) c->p++;
        const char *digits = c->p;
        while (c->p < c->end && *c->p >= '0' && *c->p <= '9') c->p++;
        if (c->p == digits) return NULL;
    }
    Py_ssize_t n = c->p - start;
    if (n > MAX_NUMBER) return NULL;
    char text[MAX_NUMBER + 1];
    memcpy(text, start, (size_t)n);
    text[n] = '\0';
    if (!is_float) return PyLong_FromString(text, NULL, 10);
    double d = PyOS_string_to_double(text, NULL, NULL); /* float(text), as json's decoder */
    if (d == -1.0 && PyErr_Occurred()) return NULL;
    return PyFloat_FromDouble(d);
}

static PyObject *literal(Cursor *c, const char *word, Py_ssize_t n, PyObject *v) {
    if (c->end - c->p < n || memcmp(c->p, word, (size_t)n) != 0) return NULL;
    c->p += n;
    return Py_NewRef(v);
}

static PyObject *array(Cursor *c) { /* at '[' */
    c->p++;
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    skip_ws(c);
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        return list;
    }
    for (;;) {
        skip_ws(c);
        PyObject *item = value(c);
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
        skip_ws(c);
        if (c->p >= c->end) break;
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p == ']') {
            c->p++;
            return list;
        }
        break;
    }
    Py_DECREF(list);
    return NULL;
}

static PyObject *object(Cursor *c) { /* at '{' */
    c->p++;
    PyObject *dict = PyDict_New();
    if (dict == NULL) return NULL;
    skip_ws(c);
    if (c->p < c->end && *c->p == '}') {
        c->p++;
        return dict;
    }
    for (;;) {
        skip_ws(c);
        if (c->p >= c->end || *c->p != '"') break;
        PyObject *key = plain_string(c);
        if (key == NULL) break;
        skip_ws(c);
        if (c->p >= c->end || *c->p != ':') {
            Py_DECREF(key);
            break;
        }
        c->p++;
        skip_ws(c);
        PyObject *item = value(c);
        int failed = item == NULL || PyDict_SetItem(dict, key, item) < 0; /* the last one wins */
        Py_DECREF(key);
        Py_XDECREF(item);
        if (failed) break;
        skip_ws(c);
        if (c->p >= c->end) break;
        if (*c->p == ',') {
            c->p++;
            continue;
        }
        if (*c->p == '}') {
            c->p++;
            return dict;
        }
        break;
    }
    Py_DECREF(dict);
    return NULL;
}

static PyObject *value(Cursor *c) {
    if (c->p >= c->end) return NULL;
    switch (*c->p) {
    case '{':
    case '[': {
        if (c->depth >= MAX_DEPTH) return NULL;
        c->depth++;
        PyObject *v = *c->p == '{' ? object(c) : array(c);
        c->depth--;
        return v;
    }
    case '"':
        return plain_string(c);
    case 'n':
        return literal(c, "null", 4, Py_None);
    case 't':
        return literal(c, "true", 4, Py_True);
    case 'f':
        return literal(c, "false", 5, Py_False);
    default:
        return number(c);
    }
}

/* bytes.lstrip()'s whitespace (ASCII, vertical tab and form feed included) */
static inline int is_bytes_space(char ch) {
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\x0b' || ch == '\x0c';
}

static PyObject *outcome(int code, PyObject *v) {
    PyObject *res = Py_BuildValue("(iO)", code, v);
    Py_DECREF(v);
    return res;
}

static PyObject *object_after(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "object_after(payload: bytes, key: bytes)");
        return NULL;
    }
    const char *p = PyBytes_AS_STRING(args[0]), *key = PyBytes_AS_STRING(args[1]);
    Py_ssize_t n = PyBytes_GET_SIZE(args[0]), m = PyBytes_GET_SIZE(args[1]);
    Py_ssize_t at = m == 0 ? n : -1; /* rfind; an empty key is found at the end */
    if (m > 0 && m <= n) {
        /* candidates by one byte of the key, from the end (memrchr): the one before its last,
         * since a key's last byte is a quote, the commonest byte of JSON */
        const Py_ssize_t k = m > 1 ? m - 2 : 0;
        const char *lo = p + k, *hi = p + n - (m - 1 - k); /* where that byte may be */
        while (hi > lo) {
            const char *hit = memrchr(lo, (unsigned char)key[k], (size_t)(hi - lo));
            if (hit == NULL) break;
            if (memcmp(hit - k, key, (size_t)m) == 0) {
                at = hit - k - p;
                break;
            }
            hi = hit;
        }
    }
    if (at < 0) return outcome(NOT_FOUND, Py_NewRef(Py_None));
    const char *q = p + at + m, *end = p + n;
    while (q < end && is_bytes_space(*q)) q++;
    if (q >= end || *q != ':') return outcome(UNSURE, Py_NewRef(Py_None));
    q++;
    while (q < end && is_bytes_space(*q)) q++;
    if (q >= end || (*q != '{' && *q != 'n')) return outcome(UNSURE, Py_NewRef(Py_None));
    /* json's raw_decode starts after nothing but the value: a \x0b or \x0c that lstrip skipped
     * before it is not JSON whitespace, but raw_decode never sees it (lstrip removed it) */
    Cursor c = {q, end, 0};
    PyObject *v = value(&c);
    if (v == NULL) {
        if (PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_ValueError)) return NULL; /* memory and such */
            PyErr_Clear();
        }
        return outcome(FALLBACK, Py_NewRef(Py_None));
    }
    return outcome(VALUE, v);
}

static PyMethodDef module_methods[] = {
    {"object_after", (PyCFunction)(void (*)(void))object_after, METH_FASTCALL,
     "object_after(payload, key) -> (outcome, value): 0 not found, 1 unsure, 2 the value, "
     "3 left to the reference"},
    {NULL},
};

static PyModuleDef_Slot module_slots[] = {
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "specproxy.proxy._usage",
    .m_doc = "The compiled specproxy.proxy.usage._object_after, for plain JSON.",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__usage(void) { return PyModuleDef_Init(&module_def); }
