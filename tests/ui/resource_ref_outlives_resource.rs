// A ResourceRef borrows its resource: it cannot be returned past the resource's scope.
use mrstack::prelude::*;

fn escape() -> ResourceRef<'static, HostAccessible> {
    let system = System::new();
    ResourceRef::new(&system)
}

fn main() {
    let _ = escape();
}
