// A ResourceRef borrows its resource: it cannot be returned past the resource's scope.
use mrstack::prelude::*;
use mrstack::erased::ResourceRef;

fn escape() -> ResourceRef<'static, HostAccessible> {
    let system = System::new();
    ResourceRef::new(&system)
}

fn main() {
    let _ = escape();
}
