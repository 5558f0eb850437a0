// Bins whose smallest block is above the largest, both literal sizes (strings here, in
// Holoscan's spelling): refused at compile time.
use mrstack::prelude::*;

fn main() {
    let _mr = resource_stack![
        System::new(),
        Binning { max: "256KB", min: "4MB" },
    ];
}
