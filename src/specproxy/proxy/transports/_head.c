/* The head of an HTTP/1.x response split into its parts, compiled: the same function as
 * `specproxy.proxy.transports.head.py_split_head`, result for result and error for error.
 *
 * Why compiled: the lean transport parses one response head per request. Measured inside a
 * serving proxy (perf_counter around the call, benchmarks/relay_cpu.py's unpaced load on the
 * build machine), the Python parse took 9.8 us a head against 3.5 us in a tight loop: a dozen
 * small string objects and a partition, split and strip per line, all with cold caches. Here the
 * head is scanned once, and only the objects the caller keeps are made: the reason, the header
 * name/value pairs, those of them that cross to the client (the names in `drop` left out, so
 * the relay filters nothing), the Content-Type, and the values of Connection,
 * Transfer-Encoding and Content-Length, which decide how the body is framed.
 *
 * Equivalence with the Python reference is tested on a corpus of heads, well formed and not, and
 * on generated ones (tests/proxy/transports/test_head.py).
 */
#define PY_SSIZE_T_CLEAN
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memmem */
#endif
#include <Python.h>
#include <string.h>

#define MESSAGE_CHARS 40 /* the characters of a bad line quoted in an error (`line[:40]`) */

/* `what: repr(text[:40])` as a ValueError; the text decoded as latin-1, as the reference does. */
static PyObject *bad(const char *what, const char *p, Py_ssize_t n) {
    PyObject *text = PyUnicode_DecodeLatin1(p, n < MESSAGE_CHARS ? n : MESSAGE_CHARS, NULL);
    if (text != NULL) {
        PyErr_Format(PyExc_ValueError, "%s: %R", what, text);
        Py_DECREF(text);
    }
    return NULL;
}

/* Whether `p[:n]` is `name` (lower-case ASCII) in any ASCII case. For latin-1 text this is what
 * a CIMultiDict lookup of these names matches: no other latin-1 character cases to ASCII. */
static int is_name(const char *p, Py_ssize_t n, const char *name, Py_ssize_t m) {
    if (n != m) return 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 'A' && c <= 'Z') c = (unsigned char)(c + ('a' - 'A'));
        if (c != (unsigned char)name[i]) return 0;
    }
    return 1;
}

/* str.strip() of a latin-1 text: Python's whitespace, which for these code points includes
 * \x1c-\x1f, \x85 and \xa0 as well as the ASCII ones. */
static inline int is_space(char c) { return Py_UNICODE_ISSPACE((Py_UCS4)(unsigned char)c); }

/* Whether `p[:n]` is one of `drop`'s names (lower-case ASCII str objects), in any ASCII case. */
static int dropped(const char *p, Py_ssize_t n, PyObject *drop) {
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(drop); i++) {
        PyObject *name = PyTuple_GET_ITEM(drop, i);
        if (PyUnicode_GET_LENGTH(name) == n &&
            is_name(p, n, (const char *)PyUnicode_DATA(name), n))
            return 1;
    }
    return 0;
}

static PyObject *split_head(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2 || !PyBytes_Check(args[0]) ||
        (nargs == 2 && !PyTuple_Check(args[1]))) {
        PyErr_SetString(PyExc_TypeError, "split_head(raw: bytes, drop: tuple[str, ...] = ())");
        return NULL;
    }
    PyObject *arg = args[0];
    PyObject *drop = nargs == 2 ? args[1] : NULL;
    if (drop != NULL) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(drop); i++) {
            PyObject *name = PyTuple_GET_ITEM(drop, i);
            if (!PyUnicode_Check(name) || !PyUnicode_IS_ASCII(name)) {
                PyErr_SetString(PyExc_TypeError, "split_head(): drop holds ASCII str names");
                return NULL;
            }
        }
    }
    const char *raw = PyBytes_AS_STRING(arg);
    Py_ssize_t size = PyBytes_GET_SIZE(arg);
    const char *eol = memmem(raw, (size_t)size, "\r\n", 2);
    Py_ssize_t sl = eol != NULL ? eol - raw : size; /* the status line's length */
    if (sl < 12 || (memcmp(raw, "HTTP/1.1 ", 9) != 0 && memcmp(raw, "HTTP/1.0 ", 9) != 0))
        return bad("not an HTTP/1.x status line", raw, sl);
    const char *code = raw + 9;
    for (int i = 0; i < 3; i++)
        if (code[i] < '0' || code[i] > '9') return bad("bad status line", raw, sl);
    if (sl > 12 && raw[12] != ' ') return bad("bad status line", raw, sl);
    long status = (code[0] - '0') * 100 + (code[1] - '0') * 10 + (code[2] - '0');
    if (status < 100) return PyErr_Format(PyExc_ValueError, "bad status code %ld", status);
    if (status < 200) Py_RETURN_NONE; /* an interim response: the real one follows */

    PyObject *reason = NULL, *pairs = NULL, *forward = NULL, *content_type = NULL;
    PyObject *connection = NULL, *encoding = NULL, *lengths = NULL, *result = NULL;
    reason = PyUnicode_DecodeLatin1(raw + 13, sl > 13 ? sl - 13 : 0, NULL);
    pairs = PyList_New(0);
    forward = PyList_New(0);
    lengths = PyList_New(0);
    if (reason == NULL || pairs == NULL || forward == NULL || lengths == NULL) goto done;
    if (eol != NULL && eol + 2 < raw + size) { /* `rest` is not empty: split it on CRLF */
        const char *line = eol + 2, *end = raw + size;
        for (;;) {
            const char *next = memmem(line, (size_t)(end - line), "\r\n", 2);
            const char *stop = next != NULL ? next : end;
            Py_ssize_t n = stop - line;
            const char *colon = memchr(line, ':', (size_t)n);
            if (colon == NULL || colon == line || colon[-1] == ' ' || colon[-1] == '\t' ||
                line[0] == ' ' || line[0] == '\t') {
                bad("bad header line", line, n);
                goto done;
            }
            const char *v = colon + 1, *v_end = stop;
            while (v < v_end && is_space(*v)) v++;
            while (v_end > v && is_space(v_end[-1])) v_end--;
            Py_ssize_t name_n = colon - line;
            PyObject *name = PyUnicode_DecodeLatin1(line, name_n, NULL);
            PyObject *value = name != NULL ? PyUnicode_DecodeLatin1(v, v_end - v, NULL) : NULL;
            PyObject *pair = value != NULL ? PyTuple_Pack(2, name, value) : NULL;
            int failed = pair == NULL || PyList_Append(pairs, pair) < 0;
            if (!failed && !(drop != NULL && dropped(line, name_n, drop)))
                failed = PyList_Append(forward, pair) < 0;
            if (!failed) {
                if (is_name(line, name_n, "content-type", 12)) {
                    if (content_type == NULL) content_type = Py_NewRef(value);
                } else if (connection == NULL && is_name(line, name_n, "connection", 10)) {
                    connection = Py_NewRef(value);
                } else if (encoding == NULL && is_name(line, name_n, "transfer-encoding", 17)) {
                    encoding = Py_NewRef(value);
                } else if (is_name(line, name_n, "content-length", 14)) {
                    failed = PyList_Append(lengths, value) < 0;
                }
            }
            Py_XDECREF(pair);
            Py_XDECREF(value);
            Py_XDECREF(name);
            if (failed) goto done;
            if (next == NULL) break;
            line = next + 2;
        }
    }
    result = Py_BuildValue(
        "(lOOOOOOOO)", status, reason, raw[7] == '0' ? Py_True : Py_False, pairs, forward,
        content_type != NULL ? content_type : Py_None, connection != NULL ? connection : Py_None,
        encoding != NULL ? encoding : Py_None, lengths);
done:
    Py_XDECREF(reason);
    Py_XDECREF(pairs);
    Py_XDECREF(forward);
    Py_XDECREF(content_type);
    Py_XDECREF(connection);
    Py_XDECREF(encoding);
    Py_XDECREF(lengths);
    return result;
}

static PyMethodDef module_methods[] = {
    {"split_head", (PyCFunction)(void (*)(void))split_head, METH_FASTCALL,
     "split_head(raw, drop=()) -> (status, reason, http10, pairs, forward, content_type, "
     "connection, encoding, lengths) | None"},
    {NULL},
};

static PyModuleDef_Slot module_slots[] = {
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "specproxy.proxy.transports._head",
    .m_doc = "The compiled specproxy.proxy.transports.head.split_head.",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__head(void) { return PyModuleDef_Init(&module_def); }
