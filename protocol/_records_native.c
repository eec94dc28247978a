/* The per-record loops of protocol/records.py in C: the produce path's walk, the compacted-topic key check and
 * the log cleaner's record listing.
 *
 * Each function answers only what the pure-Python version would answer without an error, and returns None for
 * anything else: an error, or a shape it does not take (a varint of more than 64 bits, a buffer that is not
 * bytes). protocol/records.py then runs the Python version, which decides and words the error, so the two can
 * never disagree on a message and the Python code stays the one statement of the rules. Valid batches, whatever
 * their varint widths, deltas and keys, are answered here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Above this many records the walk lets other threads (the log cleaner's) run. */
#define RELEASE_GIL_RECORDS 512

/* A zigzag varint starting at *pos that ends before ``end``, into *value; *pos moves past it. 0 on success, -1
 * if it runs to ``end``, is longer than 10 bytes, or is wider than 64 bits (Python's int would take it). */
static inline int
read_varint(const uint8_t *buf, Py_ssize_t *pos, Py_ssize_t end, int64_t *value)
{
    Py_ssize_t at = *pos;
    if (at < end && buf[at] < 0x80) { /* the usual one-byte form */
        uint8_t b = buf[at];
        *value = (int64_t)(b >> 1) ^ -(int64_t)(b & 1);
        *pos = at + 1;
        return 0;
    }
    uint64_t raw = 0;
    for (int shift = 0; shift <= 63; shift += 7) {
        if (at >= end) {
            return -1;
        }
        uint8_t b = buf[at++];
        if (shift == 63 && (b & 0x7F) > 1) {
            return -1;
        }
        raw |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            *value = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
            *pos = at;
            return 0;
        }
    }
    return -1;
}

/* The bytes of ``object`` (bytes, bytearray, a one-dimensional byte memoryview) into ``view``; 0 on success,
 * -1 with no exception set for a buffer the functions leave to Python, -1 with an exception for a non-buffer. */
static int
get_bytes(PyObject *object, Py_buffer *view)
{
    if (PyObject_GetBuffer(object, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        if (PyErr_ExceptionMatches(PyExc_BufferError)) {
            PyErr_Clear(); /* not contiguous: Python reads it as it is */
        }
        return -1;
    }
    if (view->itemsize != 1 || view->ndim > 1 || (view->format != NULL && strcmp(view->format, "B") != 0)) {
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* A ``count`` argument as a Py_ssize_t; -1 for one the functions leave to Python (negative, zero, too large). */
static Py_ssize_t
get_count(PyObject *object)
{
    if (!PyLong_Check(object)) {
        return -1;
    }
    int overflow = 0;
    long long count = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (overflow || count <= 0 || count > PY_SSIZE_T_MAX) {
        if (count == -1 && PyErr_Occurred()) {
            PyErr_Clear();
        }
        return -1;
    }
    return (Py_ssize_t)count;
}

/* An instance of a named tuple class (a tuple subclass) holding ``items``, which it takes over. */
static PyObject *
make_tuple(PyTypeObject *type, PyObject **items, Py_ssize_t size)
{
    PyObject *tuple = type->tp_alloc(type, size);
    if (tuple == NULL) {
        for (Py_ssize_t i = 0; i < size; i++) {
            Py_XDECREF(items[i]);
        }
        return NULL;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        PyTuple_SET_ITEM(tuple, i, items[i]);
    }
    return tuple;
}

static int
check_arguments(const char *name, Py_ssize_t nargs, Py_ssize_t expected, PyObject *type)
{
    if (nargs != expected) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", name, expected, nargs);
        return -1;
    }
    if (!PyType_Check(type) || !PyType_IsSubtype((PyTypeObject *)type, &PyTuple_Type)) {
        PyErr_Format(PyExc_TypeError, "%s(): the result type must be a tuple subclass", name);
        return -1;
    }
    return 0;
}

/* walk_records(body, count, check_offsets, RecordsWalk) -> RecordsWalk | None: records.py's _careful_walk. */
static PyObject *
walk_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_arguments("walk_records", nargs, 4, args[3]) < 0) {
        return NULL;
    }
    Py_ssize_t count = get_count(args[1]);
    int check_offsets = PyObject_IsTrue(args[2]);
    if (check_offsets < 0) {
        return NULL;
    }
    Py_buffer view;
    if (count < 0) {
        Py_RETURN_NONE;
    }
    if (get_bytes(args[0], &view) < 0) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    const uint8_t *body = view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = 0;
    int64_t max_timestamp_delta = INT64_MIN, min_timestamp_delta = INT64_MAX;
    int in_order = 1, ok = 0;
    PyThreadState *released = count >= RELEASE_GIL_RECORDS ? PyEval_SaveThread() : NULL;
    Py_ssize_t index;
    for (index = 0; index < count; index++) {
        int64_t length, timestamp_delta, offset_delta;
        if (read_varint(body, &pos, end, &length) < 0 || length > end - pos || length < 3) {
            break;
        }
        const Py_ssize_t record_end = pos + (Py_ssize_t)length;
        Py_ssize_t at = pos + 1; /* past the attributes byte */
        if (read_varint(body, &at, record_end, &timestamp_delta) < 0 || at >= record_end) {
            break;
        }
        if (read_varint(body, &at, record_end, &offset_delta) < 0) {
            break;
        }
        if (timestamp_delta > max_timestamp_delta) {
            max_timestamp_delta = timestamp_delta;
        }
        if (timestamp_delta < min_timestamp_delta) {
            min_timestamp_delta = timestamp_delta;
        }
        if (check_offsets && offset_delta != (int64_t)index) {
            in_order = 0;
        }
        pos = record_end;
    }
    ok = index == count && pos == end;
    if (released != NULL) {
        PyEval_RestoreThread(released);
    }
    PyBuffer_Release(&view);
    if (!ok) {
        Py_RETURN_NONE;
    }
    PyObject *items[3] = {PyLong_FromLongLong(max_timestamp_delta), PyBool_FromLong(in_order),
                          PyLong_FromLongLong(min_timestamp_delta)};
    if (items[0] == NULL || items[2] == NULL) {
        Py_XDECREF(items[0]);
        Py_XDECREF(items[1]);
        Py_XDECREF(items[2]);
        return NULL;
    }
    return make_tuple((PyTypeObject *)args[3], items, 3);
}

/* keyless_record_indexes(body, count) -> list[int] | None: records.py's _keyless_record_indexes. */
static PyObject *
keyless_record_indexes(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "keyless_record_indexes() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t count = get_count(args[1]);
    Py_buffer view;
    if (count < 0) {
        Py_RETURN_NONE;
    }
    if (get_bytes(args[0], &view) < 0) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *found = PyList_New(0);
    if (found == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *body = view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = 0, index;
    for (index = 0; index < count; index++) {
        int64_t length, skipped, key_length;
        if (read_varint(body, &pos, end, &length) < 0 || length > end - pos || length < 3) {
            break;
        }
        const Py_ssize_t record_end = pos + (Py_ssize_t)length;
        Py_ssize_t at = pos + 1; /* past the attributes: the timestamp and offset deltas, then the key length */
        if (read_varint(body, &at, record_end, &skipped) < 0 || read_varint(body, &at, record_end, &skipped) < 0
            || read_varint(body, &at, record_end, &key_length) < 0) {
            break;
        }
        if (key_length < 0) { /* null, as Kafka's DefaultRecord reads any negative length */
            PyObject *number = PyLong_FromSsize_t(index);
            if (number == NULL || PyList_Append(found, number) < 0) {
                Py_XDECREF(number);
                Py_DECREF(found);
                PyBuffer_Release(&view);
                return NULL;
            }
            Py_DECREF(number);
        }
        else if (key_length > record_end - at) {
            break;
        }
        pos = record_end;
    }
    PyBuffer_Release(&view);
    if (index != count || pos != end) {
        Py_DECREF(found);
        Py_RETURN_NONE;
    }
    return found;
}

/* raw_records(body, count, RawRecord) -> list[RawRecord] | None: records.py's _iter_raw_records, at once. */
static PyObject *
raw_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_arguments("raw_records", nargs, 3, args[2]) < 0) {
        return NULL;
    }
    PyTypeObject *record_type = (PyTypeObject *)args[2];
    Py_ssize_t count = get_count(args[1]);
    Py_buffer view;
    if (count < 0) {
        Py_RETURN_NONE;
    }
    if (get_bytes(args[0], &view) < 0) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    const uint8_t *body = view.buf;
    const Py_ssize_t end = view.len;
    /* Each record takes at least 4 bytes: a count beyond that fails anyway, and must not size the list. */
    PyObject *records = PyList_New(0);
    if (records == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t pos = 0, index;
    for (index = 0; index < count; index++) {
        int64_t length, timestamp_delta, offset_delta, key_length, value_length;
        const Py_ssize_t start = pos;
        if (read_varint(body, &pos, end, &length) < 0 || length > end - pos || length < 3) {
            break;
        }
        const Py_ssize_t record_end = pos + (Py_ssize_t)length;
        const Py_ssize_t body_start = pos;
        Py_ssize_t at = pos + 1; /* past the attributes */
        if (read_varint(body, &at, record_end, &timestamp_delta) < 0
            || read_varint(body, &at, record_end, &offset_delta) < 0) {
            break;
        }
        const Py_ssize_t delta_end = at;
        if (read_varint(body, &at, record_end, &key_length) < 0) {
            break;
        }
        const Py_ssize_t key_at = at;
        if (key_length >= 0) {
            if (key_length > record_end - at) {
                break;
            }
            at += (Py_ssize_t)key_length;
        }
        Py_ssize_t value_at = at;
        if (read_varint(body, &value_at, record_end, &value_length) < 0) {
            break;
        }
        PyObject *key;
        if (key_length >= 0) {
            key = PyBytes_FromStringAndSize((const char *)body + key_at, (Py_ssize_t)key_length);
        }
        else {
            key = Py_NewRef(Py_None);
        }
        PyObject *items[8] = {PyLong_FromLongLong(offset_delta),
                              PyLong_FromLongLong(timestamp_delta),
                              key,
                              PyBool_FromLong(value_length >= 0),
                              PyLong_FromSsize_t(start),
                              PyLong_FromSsize_t(body_start),
                              PyLong_FromSsize_t(delta_end),
                              PyLong_FromSsize_t(record_end)};
        PyObject *record = NULL;
        int complete = 1;
        for (int i = 0; i < 8; i++) {
            complete &= items[i] != NULL;
        }
        if (complete) {
            record = make_tuple(record_type, items, 8);
        }
        else {
            for (int i = 0; i < 8; i++) {
                Py_XDECREF(items[i]);
            }
        }
        if (record == NULL || PyList_Append(records, record) < 0) {
            Py_XDECREF(record);
            Py_DECREF(records);
            PyBuffer_Release(&view);
            return NULL;
        }
        Py_DECREF(record);
        pos = record_end;
    }
    PyBuffer_Release(&view);
    if (index != count || pos != end) {
        Py_DECREF(records);
        Py_RETURN_NONE;
    }
    return records;
}

static PyMethodDef methods[] = {
    {"walk_records", (PyCFunction)(void (*)(void))walk_records, METH_FASTCALL,
     "walk_records(body, count, check_offsets, result_type): the records walk's answer, or None for Python to "
     "decide"},
    {"keyless_record_indexes", (PyCFunction)(void (*)(void))keyless_record_indexes, METH_FASTCALL,
     "keyless_record_indexes(body, count): the indexes of the keyless records, or None for Python to decide"},
    {"raw_records", (PyCFunction)(void (*)(void))raw_records, METH_FASTCALL,
     "raw_records(body, count, record_type): every record as the log cleaner reads it, or None for Python to "
     "decide"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef_Slot slots[] = {
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "protocol._records_native",
    .m_doc = "The per-record loops of protocol.records in C (see protocol/records.py).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC
PyInit__records_native(void)
{
    return PyModuleDef_Init(&module_definition);
}
