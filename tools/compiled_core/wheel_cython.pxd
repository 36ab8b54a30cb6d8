# Cython declarations for aiowheel/_wheel.py in pure-Python mode (tools/compiled_core/run.sh):
# every class as a cdef class with typed attributes, the hot methods cpdef.
cdef class Bucket(dict):
    cdef public Py_ssize_t level
    cdef public object tick
    cdef public double time

cdef class WheelEntry:
    cdef public object _bucket
    cdef public double _deadline

cdef class Wheel:
    cdef public double tick
    cdef public double origin
    cdef public Py_ssize_t _size
    cdef public object _now
    cdef public list _wheel0
    cdef public list _levels
    cdef public list _widths
    cdef public list _limits
    cdef public object _limit0
    cdef public list _upper
    cdef public list _heap
    cdef public Bucket _due
    cpdef double insert(self, WheelEntry entry, double deadline) except? -1.0
    cpdef double _file(self, WheelEntry entry, object e) except? -1.0
    cpdef bint remove(self, WheelEntry entry) except -1
    cpdef double extend(self, WheelEntry entry, double deadline) except? -1.0
