//! A zero-initialised buffer aligned to a cache line, so 512-bit loads of packed panels never straddle two
//! lines (glibc's large allocations are only 16-byte aligned).

use std::alloc::{Layout, alloc_zeroed, dealloc, handle_alloc_error};
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Element types for which all-zero bytes are a valid value.
///
/// # Safety
/// Implementors must be plain data whose all-zero bit pattern is a valid value.
pub unsafe trait Zeroable: Copy {}
// SAFETY: integers and floats are valid when zeroed.
unsafe impl Zeroable for u8 {}
// SAFETY: as above.
unsafe impl Zeroable for u16 {}
// SAFETY: as above.
unsafe impl Zeroable for u32 {}
// SAFETY: as above.
unsafe impl Zeroable for f32 {}
// SAFETY: as above.
unsafe impl Zeroable for i8 {}
// SAFETY: as above.
unsafe impl Zeroable for i32 {}

const ALIGN: usize = 64;

/// An owned, 64-byte aligned, zero-initialised slice.
pub struct AlignedBuf<T: Zeroable> {
    ptr: NonNull<T>,
    len: usize,
    _own: PhantomData<T>,
}

// SAFETY: the buffer owns its elements like a Vec does.
unsafe impl<T: Zeroable + Send> Send for AlignedBuf<T> {}
// SAFETY: shared access only hands out `&[T]`.
unsafe impl<T: Zeroable + Sync> Sync for AlignedBuf<T> {}

impl<T: Zeroable> AlignedBuf<T> {
    fn layout(len: usize) -> Layout {
        let bytes = (len * size_of::<T>()).max(ALIGN);
        // The size cannot overflow isize for any buffer the engine asks for (checked by the multiplication
        // above being representable); an impossible layout aborts like a failed Vec allocation would.
        Layout::from_size_align(bytes, ALIGN)
            .unwrap_or_else(|_| handle_alloc_error(Layout::new::<T>()))
    }

    /// `len` zeros.
    pub fn zeroed(len: usize) -> Self {
        let layout = Self::layout(len);
        // SAFETY: the layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) } as *mut T;
        let ptr = NonNull::new(raw).unwrap_or_else(|| handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            len,
            _own: PhantomData,
        }
    }

    /// A copy of `src`.
    pub fn from_slice(src: &[T]) -> Self {
        let mut b = Self::zeroed(src.len());
        b.copy_from_slice(src);
        b
    }
}

impl<T: Zeroable> Drop for AlignedBuf<T> {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { dealloc(self.ptr.as_ptr() as *mut u8, Self::layout(self.len)) }
    }
}

impl<T: Zeroable> Deref for AlignedBuf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `len` initialised (zeroed) elements live at `ptr`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Zeroable> DerefMut for AlignedBuf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as above, and `&mut self` is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Zeroable> Clone for AlignedBuf<T> {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}
