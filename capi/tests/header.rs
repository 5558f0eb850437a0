//! The checked-in C header is what cbindgen generates from the sources now.

#[test]
fn the_checked_in_header_is_current() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let config =
        cbindgen::Config::from_file(format!("{dir}/cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen reads capi/src")
        .write(&mut generated);
    let path = format!("{dir}/include/mrstack.h");
    if std::env::var_os("MRSTACK_BLESS").is_some() {
        std::fs::write(&path, &generated).expect("write the header");
    }
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "capi/include/mrstack.h is not what capi/src declares: regenerate it with \
         `MRSTACK_BLESS=1 cargo test -p mrstack-capi --test header` and commit it"
    );
}

/// Every function the header declares is one of the library's own (`mrstack_…`): what the
/// library only calls (the C library's `atexit`, its C++ helpers that throw) stays out, since
/// a declaration of a system function there may differ from the system's own.
#[test]
fn the_header_declares_only_the_librarys_functions() {
    let header = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/include/mrstack.h"))
        .expect("read capi/include/mrstack.h");
    let mut declared = 0;
    for line in header.lines().map(str::trim) {
        if ["//", "#", "/*", "*"].iter().any(|p| line.starts_with(p)) {
            continue;
        }
        let Some(open) = line.find('(') else { continue };
        let name: String = line[..open]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        assert!(
            name.starts_with("mrstack_"),
            "capi/include/mrstack.h declares `{name}`, which is not the library's: `{line}`"
        );
        declared += 1;
    }
    assert!(
        declared > 20,
        "only {declared} declarations read from the header"
    );
}

/// The header compiles as the first include and as the last, beside the standard headers, in
/// C (`$CC`, else `cc`) and in C++ (`$CXX`, else `c++`), with every warning an error. The
/// compilers are required, as they are for building the library (build.rs compiles C++).
#[test]
fn the_header_compiles_first_and_last_in_c_and_cpp() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let tmp = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    // The compiler, the source's extension, its standard, and standard headers to include
    // beside mrstack.h.
    let languages: [(&str, &str, &str, &[&str]); 3] = [
        (
            &cc,
            "c",
            "-std=c99",
            &["stdlib.h", "stdio.h", "string.h", "stdint.h"],
        ),
        (
            &cxx,
            "cpp",
            "-std=c++11",
            &["string", "cstdlib", "cstdio", "new", "stdexcept", "vector"],
        ),
        (
            &cxx,
            "cpp",
            "-std=c++17",
            &["string", "cstdlib", "memory", "thread"],
        ),
    ];
    let body = "int main(void) {\n    MrstackStack *s = mrstack_create(\"system\");\n    \
                void *p = mrstack_allocate(s, 64, 0, NULL);\n    \
                mrstack_deallocate(s, p, 64, 0, NULL);\n    \
                return mrstack_destroy(s) == 0 && mrstack_last_error() != NULL ? 0 : 1;\n}\n";
    let mut failures = Vec::new();
    for (i, &(compiler, ext, standard, headers)) in languages.iter().enumerate() {
        let system: String = headers
            .iter()
            .map(|h| format!("#include <{h}>\n"))
            .collect();
        for first in [true, false] {
            let source = if first {
                format!("#include \"mrstack.h\"\n{system}\n{body}")
            } else {
                format!("{system}#include \"mrstack.h\"\n\n{body}")
            };
            let place = if first { "first" } else { "last" };
            let path = tmp.join(format!("header_{i}_{place}.{ext}"));
            std::fs::write(&path, &source).expect("write the test source");
            let out = std::process::Command::new(compiler)
                .arg(standard)
                .args(["-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-pedantic"])
                .arg(format!("-I{dir}/include"))
                .arg(&path)
                .output()
                .unwrap_or_else(|e| {
                    panic!("running `{compiler}` (set CC/CXX to another compiler): {e}")
                });
            if !out.status.success() {
                failures.push(format!(
                    "{compiler} {standard} with mrstack.h included {place}:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
