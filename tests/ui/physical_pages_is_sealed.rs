// `PhysicalPages` is where a `VirtualMemory` takes its properties from: a page source of a
// caller's own could claim device memory for pages of host memory (or map one allocation at two
// addresses through `remap`). It is sealed: only mrstack's sources implement it.
use mrstack::leaf::PhysicalPages;
use mrstack::prelude::*;

struct Claims;

unsafe impl PhysicalPages for Claims {
    type Host = mrstack::typenum::B1;
    type Device = mrstack::typenum::B1;
    type Migratable = mrstack::typenum::B0;
    type Page = ();
    type Mark = ();

    fn page_size(&self) -> usize {
        2 << 20
    }
    fn capacity(&self) -> usize {
        1 << 30
    }
    fn default_reservation(&self) -> usize {
        2 << 30
    }
    fn reserve(&self, _: usize) -> Result<usize, AllocError> {
        todo!()
    }
    unsafe fn unreserve(&self, _: usize, _: usize) {}
    unsafe fn map(&self, _: usize, _: usize) -> Result<(), AllocError> {
        Ok(())
    }
    unsafe fn enable(&self, _: usize, _: usize) -> Result<(), AllocError> {
        Ok(())
    }
    unsafe fn unmap(&self, _: usize, _: usize, _: ()) {}
    fn synchronize(&self, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
    fn order_after(&self, _: StreamRef, _: StreamRef) -> Result<(), AllocError> {
        Ok(())
    }
    fn mark(&self, _: StreamRef) -> Result<Option<()>, AllocError> {
        Ok(None)
    }
    fn reached(&self, _: &()) -> Result<bool, AllocError> {
        Ok(true)
    }
    fn wait(&self, _: &()) -> Result<(), AllocError> {
        Ok(())
    }
    fn name(&self) -> &'static str {
        "Claims"
    }
    fn describe_fields<'a, 'b>(
        &self,
        item: mrstack::stack::ItemWriter<'a, 'b>,
    ) -> mrstack::stack::ItemWriter<'a, 'b> {
        item
    }
}

fn main() {}
