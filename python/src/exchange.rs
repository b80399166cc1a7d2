//! A tensor library's DLPack C exchange API (DLPack 1.3: a `__dlpack_c_exchange_api__`
//! capsule on its tensor type, e.g. `torch.Tensor` in recent torch, 2.15 here): its
//! `managed_tensor_to_py_object_no_sync` makes the library's tensor over a managed DLPack
//! tensor in one C call. A batch's sections reach torch that way without a capsule each, a
//! Python call each into torch's capsule import, or that import's checks.

use std::ffi::{c_int, c_void, CStr};
use std::ptr;

use dlpark::ffi::{
    DLManagedTensorVersioned, DLPackExchangeAPI, DLPackExchangeAPIHeader, DLPACK_MAJOR_VERSION,
};
use dlpark::Managed;
use pyo3::exceptions::{PyAttributeError, PyRuntimeError};
use pyo3::prelude::*;

/// The capsule name DLPack gives the exchange table.
const EXCHANGE_CAPSULE: &CStr = c"dlpack_exchange_api";

/// The attribute a tensor type exposes the table as.
const EXCHANGE_ATTRIBUTE: &str = "__dlpack_c_exchange_api__";

/// Headers walked along `prev_api` looking for our major version: no library chains that
/// deep, and a cycle cannot hang the loader.
const MAX_CHAIN: usize = 16;

/// `managed_tensor_to_py_object_no_sync`'s signature.
type ToPyObject = unsafe extern "C" fn(*mut DLManagedTensorVersioned, *mut *mut c_void) -> c_int;

/// A tensor type's conversion from a managed (versioned) DLPack tensor to its Python tensor.
#[derive(Clone, Copy)]
pub struct TensorExchange {
    to_py_object: ToPyObject,
}

impl TensorExchange {
    /// The exchange of `tensor_type` (a class such as `torch.Tensor`), or `None` when it
    /// has no exchange table, none of DLPack major version 1, or no conversion to its
    /// tensors in it.
    pub fn of(tensor_type: &Bound<'_, PyAny>) -> PyResult<Option<TensorExchange>> {
        let capsule = match tensor_type.getattr(EXCHANGE_ATTRIBUTE) {
            Ok(capsule) => capsule,
            Err(e) if e.is_instance_of::<PyAttributeError>(tensor_type.py()) => return Ok(None),
            Err(e) => return Err(e),
        };
        // SAFETY: `capsule` is a live object; `PyCapsule_GetPointer` checks that it is a
        // capsule of that name (null with an exception set otherwise).
        let table =
            unsafe { pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), EXCHANGE_CAPSULE.as_ptr()) };
        if table.is_null() {
            return Err(PyErr::take(tensor_type.py()).unwrap_or_else(|| {
                PyRuntimeError::new_err(format!("{EXCHANGE_ATTRIBUTE} holds a null table"))
            }));
        }
        let mut header = table.cast::<DLPackExchangeAPIHeader>();
        for _ in 0..MAX_CHAIN {
            if header.is_null() {
                return Ok(None);
            }
            // SAFETY: DLPack requires the table (and each older one it chains to) to live as
            // long as the process, every version beginning with this header.
            let current = unsafe { &*header };
            if current.version.major == DLPACK_MAJOR_VERSION {
                // SAFETY: a table of our major version has `DLPackExchangeAPI`'s layout.
                let api = unsafe { &*header.cast::<DLPackExchangeAPI>() };
                return Ok(api
                    .managed_tensor_to_py_object_no_sync
                    .map(|to_py_object| TensorExchange { to_py_object }));
            }
            header = current.prev_api;
        }
        Ok(None)
    }

    /// The library's tensor over `tensor`, which it now owns (and frees, calling the
    /// tensor's deleter, when the tensor object goes). No stream is synchronised.
    pub fn tensor<'py>(
        &self,
        py: Python<'py>,
        tensor: Managed<DLManagedTensorVersioned>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut object = ptr::null_mut();
        // SAFETY: the function comes from a table of our major version; it takes ownership
        // of the managed tensor (a valid one, with its deleter), and on success stores a
        // new reference in `object`; the GIL is held.
        let rc = unsafe { (self.to_py_object)(tensor.into_raw(), &mut object) };
        if rc != 0 {
            return Err(PyErr::take(py).unwrap_or_else(|| {
                PyRuntimeError::new_err("the tensor library's DLPack exchange failed")
            }));
        }
        // SAFETY: on success `object` is a new (owned) reference, or null, which is an error.
        unsafe { Bound::from_owned_ptr_or_err(py, object.cast()) }
    }
}
