/* The per-record loops of protocol/records.py in C: the produce path's walk (walk_records), the compacted-topic
 * key check (keyless_record_indexes), broker-side recompression's check (builder_timestamp_deltas) and the log
 * cleaner's (raw_records, map_record_keys, retained_records).
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

/* One record as the log cleaner reads it (records.py's RawRecord, and where its key is). */
typedef struct {
    Py_ssize_t start, body_start, delta_end, end, key_at;
    int64_t offset_delta, timestamp_delta, key_length, value_length;
} raw_record;

/* The record at ``pos``, read as _iter_raw_records reads it but with every field inside the record; 0 on
 * success, -1 for anything _iter_raw_records might see otherwise. */
static inline int
read_raw_record(const uint8_t *body, Py_ssize_t pos, Py_ssize_t end, raw_record *record)
{
    int64_t length;
    record->start = pos;
    if (read_varint(body, &pos, end, &length) < 0 || length > end - pos || length < 3) {
        return -1;
    }
    record->end = pos + (Py_ssize_t)length;
    record->body_start = pos;
    Py_ssize_t at = pos + 1; /* past the attributes */
    if (read_varint(body, &at, record->end, &record->timestamp_delta) < 0
        || read_varint(body, &at, record->end, &record->offset_delta) < 0) {
        return -1;
    }
    record->delta_end = at;
    if (read_varint(body, &at, record->end, &record->key_length) < 0) {
        return -1;
    }
    record->key_at = at;
    if (record->key_length >= 0) { /* any negative length is a null key, as Kafka's DefaultRecord reads it */
        if (record->key_length > record->end - at) {
            return -1;
        }
        at += (Py_ssize_t)record->key_length;
    }
    return read_varint(body, &at, record->end, &record->value_length);
}

static PyObject *
record_key(const uint8_t *body, const raw_record *record)
{
    if (record->key_length < 0) {
        return Py_NewRef(Py_None);
    }
    return PyBytes_FromStringAndSize((const char *)body + record->key_at, (Py_ssize_t)record->key_length);
}

/* records.py's RawRecord for ``raw``. */
static PyObject *
new_raw_record(PyTypeObject *record_type, const uint8_t *body, const raw_record *raw)
{
    PyObject *items[8] = {PyLong_FromLongLong(raw->offset_delta),
                          PyLong_FromLongLong(raw->timestamp_delta),
                          record_key(body, raw),
                          PyBool_FromLong(raw->value_length >= 0),
                          PyLong_FromSsize_t(raw->start),
                          PyLong_FromSsize_t(raw->body_start),
                          PyLong_FromSsize_t(raw->delta_end),
                          PyLong_FromSsize_t(raw->end)};
    for (int i = 0; i < 8; i++) {
        if (items[i] == NULL) {
            for (int j = 0; j < 8; j++) {
                Py_XDECREF(items[j]);
            }
            return NULL;
        }
    }
    return make_tuple(record_type, items, 8);
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
    /* Not sized by ``count``: a count larger than the records fails, and must not allocate. */
    PyObject *records = PyList_New(0);
    if (records == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t pos = 0, index;
    for (index = 0; index < count; index++) {
        raw_record raw;
        if (read_raw_record(body, pos, end, &raw) < 0) {
            break;
        }
        PyObject *record = new_raw_record(record_type, body, &raw);
        if (record == NULL || PyList_Append(records, record) < 0) {
            Py_XDECREF(record);
            Py_DECREF(records);
            PyBuffer_Release(&view);
            return NULL;
        }
        Py_DECREF(record);
        pos = raw.end;
    }
    PyBuffer_Release(&view);
    if (index != count || pos != end) {
        Py_DECREF(records);
        Py_RETURN_NONE;
    }
    return records;
}

/* Whether all ``count`` records of the body are read by read_raw_record, end where it ends, and have offsets
 * (``base_offset`` plus their delta) within 64 bits: then a second pass cannot fail on them. */
static int
all_records_readable(const uint8_t *body, Py_ssize_t end, Py_ssize_t count, long long base_offset)
{
    Py_ssize_t pos = 0;
    for (Py_ssize_t index = 0; index < count; index++) {
        raw_record raw;
        long long offset;
        if (read_raw_record(body, pos, end, &raw) < 0
            || __builtin_add_overflow(base_offset, (long long)raw.offset_delta, &offset)) {
            return 0;
        }
        pos = raw.end;
    }
    return pos == end;
}

/* A record's key as the offset map holds it: itself, or ``long_key(key)`` when longer than ``max_short_key``. */
static PyObject *
map_key(const uint8_t *body, const raw_record *raw, Py_ssize_t max_short_key, PyObject *long_key)
{
    PyObject *key = record_key(body, raw);
    if (key != NULL && raw->key_length > max_short_key) {
        Py_SETREF(key, PyObject_CallOneArg(long_key, key));
    }
    return key;
}

/* map_record_keys(body, count, base_offset, slots, from_offset, capacity, max_short_key, long_key, KeysMapped)
 * -> KeysMapped | None: records.py's _map_record_keys. The records are all read before the map is touched, so
 * that None (records Python must read, and fail on) leaves ``slots`` as it was. */
static PyObject *
map_record_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_arguments("map_record_keys", nargs, 9, args[8]) < 0) {
        return NULL;
    }
    PyObject *slots = args[3], *long_key = args[7];
    Py_ssize_t count = get_count(args[1]);
    int base_overflow = 0, from_overflow = 0;
    long long base_offset = PyLong_Check(args[2]) ? PyLong_AsLongLongAndOverflow(args[2], &base_overflow) : 0;
    long long from_offset = PyLong_Check(args[4]) ? PyLong_AsLongLongAndOverflow(args[4], &from_overflow) : 0;
    Py_ssize_t capacity = PyLong_Check(args[5]) ? PyLong_AsSsize_t(args[5]) : -1;
    Py_ssize_t max_short_key = PyLong_Check(args[6]) ? PyLong_AsSsize_t(args[6]) : -1;
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (count < 0 || base_overflow || from_overflow || !PyLong_Check(args[2]) || !PyLong_Check(args[4]) || capacity < 0
        || max_short_key < 0 || !PyDict_CheckExact(slots)) {
        Py_RETURN_NONE;
    }
    Py_buffer view;
    if (get_bytes(args[0], &view) < 0) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    const uint8_t *body = view.buf;
    const Py_ssize_t end = view.len;
    if (!all_records_readable(body, end, count, base_offset)) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    Py_ssize_t pos = 0, index;
    long long mapped = 0, latest_offset = -1;
    PyObject *stopped_at = Py_NewRef(Py_None);
    pos = 0;
    for (index = 0; index < count; index++) {
        raw_record raw;
        read_raw_record(body, pos, end, &raw);
        pos = raw.end;
        const long long offset = base_offset + raw.offset_delta;
        if (raw.key_length < 0 || offset < from_offset) {
            continue;
        }
        PyObject *key = map_key(body, &raw, max_short_key, long_key);
        PyObject *number = key != NULL ? PyLong_FromLongLong(offset) : NULL;
        if (number == NULL) {
            Py_XDECREF(key);
            goto failed;
        }
        if (PyDict_GET_SIZE(slots) >= capacity) {
            int known = PyDict_Contains(slots, key);
            if (known <= 0) {
                Py_DECREF(key);
                if (known < 0) {
                    Py_DECREF(number);
                    goto failed;
                }
                Py_SETREF(stopped_at, number);
                break;
            }
        }
        int stored = PyDict_SetItem(slots, key, number);
        Py_DECREF(key);
        Py_DECREF(number);
        if (stored < 0) {
            goto failed;
        }
        latest_offset = offset;
        mapped++;
    }
    PyBuffer_Release(&view);
    PyObject *items[3] = {stopped_at, PyLong_FromLongLong(mapped), PyLong_FromLongLong(latest_offset)};
    if (items[1] == NULL || items[2] == NULL) {
        Py_DECREF(items[0]);
        Py_XDECREF(items[1]);
        Py_XDECREF(items[2]);
        return NULL;
    }
    return make_tuple((PyTypeObject *)args[8], items, 3);

failed:
    Py_XDECREF(stopped_at);
    PyBuffer_Release(&view);
    return NULL;
}

/* retained_records(body, count, base_offset, slots, mapped_up_to, retain_deletes, max_short_key, long_key,
 * RawRecord) -> (list[RawRecord], bool) | None: records.py's _retained_records. */
static PyObject *
retained_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_arguments("retained_records", nargs, 9, args[8]) < 0) {
        return NULL;
    }
    PyTypeObject *record_type = (PyTypeObject *)args[8];
    PyObject *slots = args[3], *long_key = args[7];
    Py_ssize_t count = get_count(args[1]);
    int base_overflow = 0, mapped_overflow = 0;
    long long base_offset = PyLong_Check(args[2]) ? PyLong_AsLongLongAndOverflow(args[2], &base_overflow) : 0;
    long long mapped_up_to = PyLong_Check(args[4]) ? PyLong_AsLongLongAndOverflow(args[4], &mapped_overflow) : 0;
    Py_ssize_t max_short_key = PyLong_Check(args[6]) ? PyLong_AsSsize_t(args[6]) : -1;
    int retain_deletes = PyObject_IsTrue(args[5]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (count < 0 || base_overflow || mapped_overflow || !PyLong_Check(args[2]) || !PyLong_Check(args[4])
        || max_short_key < 0 || !PyDict_CheckExact(slots)) {
        Py_RETURN_NONE;
    }
    Py_buffer view;
    if (get_bytes(args[0], &view) < 0) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    const uint8_t *body = view.buf;
    const Py_ssize_t end = view.len;
    if (!all_records_readable(body, end, count, base_offset)) {
        PyBuffer_Release(&view);
        Py_RETURN_NONE;
    }
    PyObject *kept = PyList_New(0);
    if (kept == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    int tombstones = 0;
    Py_ssize_t pos = 0;
    for (Py_ssize_t index = 0; index < count; index++) {
        raw_record raw;
        read_raw_record(body, pos, end, &raw);
        pos = raw.end;
        const long long offset = base_offset + raw.offset_delta;
        const int has_value = raw.value_length >= 0;
        if (offset <= mapped_up_to) {
            if (raw.key_length < 0) {
                continue; /* keyless, which a compacted topic cannot hold */
            }
            PyObject *key = map_key(body, &raw, max_short_key, long_key);
            if (key == NULL) {
                goto failed;
            }
            PyObject *latest = PyDict_GetItemWithError(slots, key); /* borrowed */
            Py_DECREF(key);
            if (latest == NULL && PyErr_Occurred()) {
                goto failed;
            }
            if (latest != NULL) {
                /* slots.get(key, -1) > offset, compared as Python compares them */
                PyObject *here = PyLong_FromLongLong(offset);
                int superseded = here != NULL ? PyObject_RichCompareBool(latest, here, Py_GT) : -1;
                Py_XDECREF(here);
                if (superseded < 0) {
                    goto failed;
                }
                if (superseded) {
                    continue;
                }
            }
            else if (-1 > offset) {
                continue;
            }
            if (!has_value && !retain_deletes) {
                continue; /* a tombstone past its delete horizon */
            }
        }
        tombstones |= !has_value;
        PyObject *record = new_raw_record(record_type, body, &raw);
        if (record == NULL || PyList_Append(kept, record) < 0) {
            Py_XDECREF(record);
            goto failed;
        }
        Py_DECREF(record);
    }
    PyBuffer_Release(&view);
    PyObject *answer = PyTuple_New(2);
    if (answer == NULL) {
        Py_DECREF(kept);
        return NULL;
    }
    PyTuple_SET_ITEM(answer, 0, kept);
    PyTuple_SET_ITEM(answer, 1, PyBool_FromLong(tombstones));
    return answer;

failed:
    Py_DECREF(kept);
    PyBuffer_Release(&view);
    return NULL;
}

/* builder_timestamp_deltas(body, count) -> (int, int) | False | None: records.py's _builder_timestamp_deltas,
 * False where it answers None (records not as Kafka's builder writes them), None where Python must decide. */
static PyObject *
builder_timestamp_deltas(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "builder_timestamp_deltas() takes 2 arguments (%zd given)", nargs);
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
    const uint8_t *body = view.buf;
    const Py_ssize_t end = view.len;
    Py_ssize_t pos = 0, index;
    int64_t lowest = 0, highest = 0;
    int verdict = -1; /* -1: Python decides, 0: not the builder's layout, 1: the deltas */
    for (index = 0; index < count; index++) {
        int64_t length, timestamp_delta, offset_delta;
        if (read_varint(body, &pos, end, &length) < 0 || length > end - pos || length < 3) {
            break;
        }
        const Py_ssize_t record_end = pos + (Py_ssize_t)length;
        if (body[pos] != 0) { /* attributes: Kafka writes 0 */
            verdict = 0;
            break;
        }
        Py_ssize_t at = pos + 1;
        if (read_varint(body, &at, record_end, &timestamp_delta) < 0) {
            break;
        }
        if (index == 0 && timestamp_delta != 0) {
            verdict = 0;
            break;
        }
        if (timestamp_delta > highest) {
            highest = timestamp_delta;
        }
        if (timestamp_delta < lowest) {
            lowest = timestamp_delta;
        }
        if (read_varint(body, &at, record_end, &offset_delta) < 0) {
            break;
        }
        if (offset_delta != (int64_t)index) {
            verdict = 0;
            break;
        }
        pos = record_end;
    }
    if (index == count && pos == end) {
        verdict = 1;
    }
    PyBuffer_Release(&view);
    if (verdict < 0) {
        Py_RETURN_NONE;
    }
    if (verdict == 0) {
        Py_RETURN_FALSE;
    }
    return Py_BuildValue("(LL)", (long long)lowest, (long long)highest);
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
    {"map_record_keys", (PyCFunction)(void (*)(void))map_record_keys, METH_FASTCALL,
     "map_record_keys(body, count, base_offset, slots, from_offset, capacity, max_short_key, long_key, "
     "result_type): the log cleaner's offset map of one batch, or None (slots untouched) for Python to decide"},
    {"retained_records", (PyCFunction)(void (*)(void))retained_records, METH_FASTCALL,
     "retained_records(body, count, base_offset, slots, mapped_up_to, retain_deletes, max_short_key, long_key, "
     "record_type): the records the log cleaner keeps of one batch and whether one is a tombstone, or None for "
     "Python to decide"},
    {"builder_timestamp_deltas", (PyCFunction)(void (*)(void))builder_timestamp_deltas, METH_FASTCALL,
     "builder_timestamp_deltas(body, count): the smallest and largest timestamp delta of records as Kafka's "
     "builder writes them, False for other records, or None for Python to decide"},
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
