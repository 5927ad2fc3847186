/* HTTP/1.1 framing for the lean transport, compiled: the same functions as
 * `specproxy.proxy.transports.wire.py_split_head` and `py_take_chunked`, result for result and
 * error for error.
 *
 * split_head:
 * Why compiled: the lean transport parses one response head per request. Measured inside a
 * serving proxy (perf_counter around the call, benchmarks/relay_cpu.py's unpaced load on the
 * build machine), the Python parse took 9.8 us a head against 3.5 us in a tight loop: a dozen
 * small string objects and a partition, split and strip per line, all with cold caches. Here the
 * head is scanned once, and only the objects the caller keeps are made: the reason, the header
 * name/value pairs, those of them that cross to the client (the names in `drop` left out, so
 * the relay filters nothing), the Content-Type, and the values of Connection,
 * Transfer-Encoding and Content-Length, which decide how the body is framed.
 *
 *
 * take_chunked: vLLM (uvicorn) streams with chunked framing, one chunk per event, so a stream of
 * n events is n decodes. The reference's regex match, int(), memoryview slice, list, join and
 * del were a few microseconds an event inside the proxy; here one pass finds the size lines and
 * copies the data out once.
 *
 * Equivalence with the Python references is tested on a corpus of heads and chunked bodies, well
 * formed and not, cut anywhere, and on generated ones (tests/proxy/transports/test_wire.py).
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


#define MAX_CHUNK_LINE 4096 /* wire.MAX_CHUNK_LINE: a test holds them equal */
#define MAX_SIZE_DIGITS 15  /* longer sizes (past 2**60 bytes) go to the reference's int() */

static inline int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* bytes.strip()'s whitespace */
static inline int is_bytes_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\x0b' || c == '\x0c';
}

/* take_chunked(buf: bytearray, left: int) -> (data, left, ended), as `py_take_chunked`. A size
 * of more than MAX_SIZE_DIGITS hex digits is read by the reference, from the state reached: the
 * C part consumes what it decoded, then hands the rest to `py_take_chunked`. */
static PyObject *take_chunked(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyByteArray_CheckExact(args[0]) || !PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "take_chunked(buf: bytearray, left: int)");
        return NULL;
    }
    PyObject *bufobj = args[0];
    Py_ssize_t left = PyLong_AsSsize_t(args[1]);
    if (left == -1 && PyErr_Occurred()) return NULL;
    const char *buf = PyByteArray_AS_STRING(bufobj);
    const Py_ssize_t size_of = PyByteArray_GET_SIZE(bufobj);
    Py_ssize_t pos = 0;
    int done = 0, refer = 0;
    /* the data: one piece is most calls; more are gathered into `joined` */
    const char *one = NULL;
    Py_ssize_t one_n = 0, pieces = 0;
    PyObject *joined = NULL; /* a bytearray, once a second piece comes */
    for (;;) {
        if (left == -1) { /* a size line */
            const char *line = buf + pos;
            const char *end = memmem(line, (size_t)(size_of - pos), "\r\n", 2);
            if (end == NULL) {
                if (size_of - pos > MAX_CHUNK_LINE) {
                    PyErr_SetString(PyExc_ValueError, "chunk size line too long");
                    goto error;
                }
                break;
            }
            /* the size text: up to a ';' (extensions), stripped */
            const char *a = line, *b = end;
            const char *semi = memchr(a, ';', (size_t)(b - a));
            if (semi != NULL) b = semi;
            while (a < b && is_bytes_space(*a)) a++;
            while (b > a && is_bytes_space(b[-1])) b--;
            int bad = a == b;
            for (const char *c = a; c < b && !bad; c++) bad = hex_value(*c) < 0;
            if (bad) {
                PyObject *text = PyBytes_FromStringAndSize(a, b - a < 20 ? b - a : 20);
                if (text != NULL) {
                    PyErr_Format(PyExc_ValueError, "bad chunk size %R", text);
                    Py_DECREF(text);
                }
                goto error;
            }
            if (b - a > MAX_SIZE_DIGITS) {
                refer = 1; /* the reference reads this line: stop before it */
                break;
            }
            Py_ssize_t size = 0;
            for (const char *c = a; c < b; c++) size = size * 16 + hex_value(*c);
            pos = end + 2 - buf;
            left = size == 0 ? -2 : size;
        }
        if (left == -2) { /* trailers, up to an empty line */
            const char *end = memmem(buf + pos, (size_t)(size_of - pos), "\r\n", 2);
            if (end == NULL) break;
            int last = end == buf + pos;
            pos = end + 2 - buf;
            if (last) {
                done = 1;
                break;
            }
            continue;
        }
        if (left > 0) {
            Py_ssize_t n = left < size_of - pos ? left : size_of - pos;
            if (n == 0) break;
            if (pieces == 0) {
                one = buf + pos;
                one_n = n;
            } else {
                if (joined == NULL) {
                    joined = PyByteArray_FromStringAndSize(one, one_n);
                    if (joined == NULL) goto error;
                }
                Py_ssize_t had = PyByteArray_GET_SIZE(joined);
                if (PyByteArray_Resize(joined, had + n) < 0) goto error;
                memcpy(PyByteArray_AS_STRING(joined) + had, buf + pos, (size_t)n);
            }
            pieces++;
            pos += n;
            left -= n;
            if (left) break;
        }
        /* the chunk's data is complete: its CRLF */
        if (size_of - pos < 2) {
            left = 0;
            break;
        }
        if (buf[pos] != '\r' || buf[pos + 1] != '\n') {
            PyErr_SetString(PyExc_ValueError, "chunk not followed by CRLF");
            goto error;
        }
        pos += 2;
        left = -1;
    }
    PyObject *data;
    if (joined != NULL) {
        data = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(joined), PyByteArray_GET_SIZE(joined));
        Py_CLEAR(joined);
    } else {
        data = PyBytes_FromStringAndSize(one, one_n);
    }
    if (data == NULL) return NULL;
    if (pos && PySequence_DelSlice(bufobj, 0, pos) < 0) {
        Py_DECREF(data);
        return NULL;
    }
    if (refer) { /* the rest by the reference, from here */
        PyObject *wire = PyImport_ImportModule("specproxy.proxy.transports.wire");
        PyObject *rest = wire != NULL ? PyObject_CallMethod(wire, "py_take_chunked", "On", bufobj,
                                                            left)
                                      : NULL;
        Py_XDECREF(wire);
        if (rest == NULL) {
            Py_DECREF(data);
            return NULL;
        }
        PyObject *tail = PyTuple_GET_ITEM(rest, 0);
        PyObject *both = PyBytes_FromStringAndSize(NULL, PyBytes_GET_SIZE(data) + PyBytes_GET_SIZE(tail));
        if (both == NULL) {
            Py_DECREF(rest);
            Py_DECREF(data);
            return NULL;
        }
        memcpy(PyBytes_AS_STRING(both), PyBytes_AS_STRING(data), (size_t)PyBytes_GET_SIZE(data));
        memcpy(PyBytes_AS_STRING(both) + PyBytes_GET_SIZE(data), PyBytes_AS_STRING(tail),
               (size_t)PyBytes_GET_SIZE(tail));
        Py_DECREF(data);
        PyObject *res = Py_BuildValue("(NOO)", both, PyTuple_GET_ITEM(rest, 1), PyTuple_GET_ITEM(rest, 2));
        Py_DECREF(rest);
        return res;
    }
    return Py_BuildValue("(NnO)", data, left, done ? Py_True : Py_False);
error:
    Py_XDECREF(joined);
    return NULL;
}

static PyMethodDef module_methods[] = {
    {"split_head", (PyCFunction)(void (*)(void))split_head, METH_FASTCALL,
     "split_head(raw, drop=()) -> (status, reason, http10, pairs, forward, content_type, "
     "connection, encoding, lengths) | None"},
    {"take_chunked", (PyCFunction)(void (*)(void))take_chunked, METH_FASTCALL,
     "take_chunked(buf, left) -> (data, left, ended): decode and consume a chunked body's bytes"},
    {NULL},
};

static PyModuleDef_Slot module_slots[] = {
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "specproxy.proxy.transports._wire",
    .m_doc = "The compiled split_head and take_chunked of specproxy.proxy.transports.wire.",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__wire(void) { return PyModuleDef_Init(&module_def); }
