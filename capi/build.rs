//! Compiles the C++ helpers that throw (`src/throwing.cpp`) into the library.
fn main() {
    println!("cargo:rerun-if-changed=src/throwing.cpp");
    cc::Build::new()
        .cpp(true)
        .file("src/throwing.cpp")
        .flag_if_supported("-std=c++17")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile("mrstack_throwing");
    // The exceptions need the C++ runtime.
    println!("cargo:rustc-link-lib=dylib=stdc++");
}
