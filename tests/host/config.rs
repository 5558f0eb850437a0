//! Host tests of stacks from text: good inputs build the stack they say, every malformed input is
//! an error naming the column and what is wrong, and printing a parsed stack reads back the same.

use crate::adaptor_support::{claims, deallocate_to, streams};
use mrstack::config::{self, ConfigError, ConfigErrorKind, StackBuilder, StackSpec};
use mrstack::prelude::*;
use mrstack::{erased::AnyResource, leaf::VirtualMemory, resource::AllocErrorKind, suballoc::Pool};
use proptest::prelude::*;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

const S: StreamRef = StreamRef::DEFAULT;

/// A test adaptor: counts allocations and carries a label, so that tests can see the order of
/// the layers a text built.
struct Counting<U> {
    upstream: U,
    label: String,
    count: AtomicUsize,
}

// SAFETY: every call goes to `upstream` unchanged.
unsafe impl<U: MemoryResource> MemoryResource for Counting<U> {
    claims! { as U }
    fn allocate(&self, size: usize, align: usize, s: StreamRef) -> Result<NonNull<u8>, AllocError> {
        self.count.fetch_add(1, Ordering::Relaxed);
        self.upstream.allocate(size, align, s)
    }
    deallocate_to!(upstream);
    streams!(to upstream);
    fn name(&self) -> &'static str {
        "Counting"
    }
}

struct CountingConfig {
    label: String,
}

impl<U: MemoryResource> Layer<U> for CountingConfig {
    type Resource = Counting<U>;
    fn layer(self, upstream: U) -> Counting<U> {
        Counting {
            upstream,
            label: self.label,
            count: AtomicUsize::new(0),
        }
    }
}

/// A builder that knows `count(label=…)`, as the crate's adaptors are registered.
fn builder<P: mrstack::property::PropertySet>() -> StackBuilder<P> {
    StackBuilder::new().with_adaptor("count", |item, below| {
        item.check_fields(&["label"])?;
        let label = item.text("label").ok_or_else(|| item.missing("label"))?;
        item.layer(
            CountingConfig {
                label: label.to_string(),
            },
            below,
        )
    })
}

#[test]
fn a_leaf_alone() {
    let mr = config::build::<()>("simulated(capacity=1GiB)").unwrap();
    let sim: &Simulated = mr.downcast_ref().unwrap();
    assert_eq!(sim.capacity(), 1 << 30);
    let p = mr.allocate(1 << 20, 256, S).unwrap();
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate(p, 1 << 20, 256, S) };

    let host = config::build::<HostAccessible>("system").unwrap();
    let p = host.allocate(64, 8, S).unwrap();
    // SAFETY: host memory of 64 bytes, just allocated; then freed with its size and align.
    unsafe {
        p.as_ptr().write_bytes(1, 64);
        host.deallocate(p, 64, 8, S);
    }
    assert_eq!(host.name(), "System");
}

#[test]
fn white_space_sizes_and_quotes_are_read() {
    for text in [
        "simulated(capacity=65536)",
        "  simulated ( capacity = 64 KiB )  ",
        "simulated(capacity=64KiB,)",
        "simulated(capacity=\"64 KiB\")",
        "simulated(\n\tcapacity = 65_536 B\n)",
    ] {
        let mr = config::build::<()>(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(
            mr.downcast_ref::<Simulated>().unwrap().capacity(),
            65536,
            "{text:?}"
        );
    }
    let spec: StackSpec = r#"x(path="a, (b) > \"c\" \\ d", n = 3 )"#.parse().unwrap();
    assert_eq!(spec.items[0].text("path"), Some(r#"a, (b) > "c" \ d"#));
    assert_eq!(spec.items[0].number("n").unwrap(), Some(3));
    assert_eq!(spec.items[0].fields[1].value_position, 34);
}

#[test]
fn adaptors_wrap_the_item_before_them_in_order() {
    let mr = builder::<()>()
        .build("simulated(capacity=1MiB) > count(label=inner) > count(label=outer)")
        .unwrap();
    let outer: &Counting<AnyResource<()>> = mr.downcast_ref().unwrap();
    assert_eq!(outer.label, "outer");
    let inner: &Counting<AnyResource<()>> = outer.upstream.downcast_ref().unwrap();
    assert_eq!(inner.label, "inner");
    let sim: &Simulated = inner.upstream.downcast_ref().unwrap();
    let p = mr.allocate(1000, 8, S).unwrap();
    assert_eq!(sim.in_use(), 1000);
    assert_eq!(outer.count.load(Ordering::Relaxed), 1);
    assert_eq!(inner.count.load(Ordering::Relaxed), 1);
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate(p, 1000, 8, S) };
    assert_eq!(sim.in_use(), 0);
    assert_eq!(mr.name(), "Counting");
}

#[test]
fn a_leaf_lacking_a_property_is_refused_before_it_is_built() {
    let e = config::build::<DeviceAccessible>("system").unwrap_err();
    assert!(matches!(e.kind, ConfigErrorKind::Properties { .. }));
    assert_eq!(
        e.to_string(),
        "column 1: `system` gives HostAccessible + Pageable memory, but the stack must give DeviceAccessible"
    );
    // `cuda` lacks HostAccessible: refused without touching a driver.
    let e = config::build::<HostAccessible>("cuda(device=0)").unwrap_err();
    assert_eq!(
        e.to_string(),
        "column 1: `cuda` gives DeviceAccessible memory, but the stack must give HostAccessible"
    );
    let e = config::build::<(HostAccessible, DeviceAccessible)>("simulated(capacity=1KiB)")
        .unwrap_err();
    assert!(
        e.to_string().contains("gives no access property memory"),
        "{e}"
    );
}

#[test]
fn cuda_leaves_without_a_driver_say_so() {
    if crate::support::driver_loaded("a driver is loaded here (the GPU suite builds CUDA leaves)") {
        return;
    }
    for text in [
        "cuda",
        "cuda_async(initial=1MiB)",
        "cuda_async_view",
        "cuda_async_managed(device=0)",
        "sam_headroom(headroom=1 GiB)",
        "managed",
        "pinned(device=0)",
    ] {
        let e = config::build::<DeviceAccessible>(text).unwrap_err();
        match &e.kind {
            ConfigErrorKind::Resource { error, .. } => {
                assert_eq!(error.kind, AllocErrorKind::NoDriver, "{text}: {e}")
            }
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn vmm_over_simulated_pages_builds_describes_itself_and_refuses_contradictions() {
    let text = "vmm(simulated=64 MiB, page=64 KiB, max=1 MiB, cache=0 B)";
    let mr = config::build::<()>(text).unwrap();
    let vm: &VirtualMemory<Simulated> = mr.downcast_ref().unwrap();
    let p = mr.allocate(100 << 10, 256, S).unwrap();
    assert_eq!(vm.usage().mapped, 128 << 10, "two 64 KiB pages");
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate(p, 100 << 10, 256, S) };
    assert_eq!(vm.usage().mapped, 0, "no cache");
    assert!(
        mr.allocate(2 << 20, 256, S).unwrap_err().is_out_of_memory(),
        "over max"
    );
    // The description builds the same resource again.
    let described = mr.describe().to_string();
    assert_eq!(
        described,
        "vmm(simulated=64 MiB, page=64 KiB, max=1 MiB, cache=0 B)"
    );
    let again = config::build::<()>(&described).unwrap();
    assert_eq!(again.describe().to_string(), described);
    // Simulated pages are no device's, and give no property a device stack needs.
    fails(
        "vmm(simulated=64MiB, device=0)",
        29,
        "no `device` beside `simulated`",
    );
    let e = config::build::<DeviceAccessible>("vmm(simulated=64MiB)").unwrap_err();
    assert!(matches!(e.kind, ConfigErrorKind::Properties { .. }), "{e}");
    fails("vmm(simulated=64MiB, pages=1)", 22, "pages");
}

/// `text` fails with an error at `column` (from 1) whose message contains `says`.
fn fails(text: &str, column: usize, says: &str) -> ConfigError {
    let e = builder::<()>().build(text).unwrap_err();
    assert_eq!(e.position + 1, column, "{text:?}: {e}");
    assert!(e.to_string().contains(says), "{text:?}: {e}");
    assert!(
        e.to_string().starts_with(&format!("column {column}: ")),
        "{e}"
    );
    e
}

#[test]
fn malformed_text_is_an_error_at_its_column() {
    use ConfigErrorKind as K;
    let e = fails("", 1, "empty configuration");
    assert_eq!(e.kind, K::Empty);
    fails("   \n ", 6, "empty configuration");
    fails(
        "simulated(capacity=1GiB) >",
        27,
        "expected a resource or adaptor name, found the end of the text",
    );
    fails(
        "> system",
        1,
        "expected a resource or adaptor name, found `>`",
    );
    fails(
        "simulated(capacity=1GiB",
        24,
        "expected `,` or `)` after the value of `capacity`, found the end",
    );
    fails(
        "simulated(capacity=1GiB > system",
        25,
        "expected `,` or `)` after the value of `capacity`, found `>`",
    );
    fails(
        "simulated(capacity)",
        19,
        "expected `=` after the field `capacity`, found `)`",
    );
    fails(
        "simulated(capacity=)",
        20,
        "expected a value for `capacity`, found `)`",
    );
    fails(
        "simulated(capacity= , x=1)",
        21,
        "expected a value for `capacity`",
    );
    fails(
        "simulated(=5)",
        11,
        "expected a field name of `simulated`, or `)`, found `=`",
    );
    fails(
        "simulated(capacity=1GiB) system",
        26,
        "expected `>` between items, or the end, found `s`",
    );
    fails("simulated(capacity=1GiB) # x", 26, "found `#`");
    fails("sim-ulated", 4, "found `-`");
    fails("é > system", 1, "found `é`");
    let e = fails("simulated(capacity=\"1GiB)", 20, "not closed");
    assert_eq!(e.kind, K::UnterminatedString);
    let e = fails(
        "simulated(capacity=1GiB, capacity=2GiB)",
        26,
        "has the field `capacity` twice",
    );
    assert!(matches!(e.kind, K::DuplicateField { .. }));
}

#[test]
fn bad_sizes_and_values_are_errors_at_the_value() {
    fails(
        "simulated(capacity=1XB)",
        20,
        "bad size `1XB` for `simulated.capacity`: unknown size unit `XB`",
    );
    fails(
        "simulated(capacity=1.5.0GiB)",
        20,
        "bad size `1.5.0GiB` for `simulated.capacity`: a size is a number and an optional unit",
    );
    fails("simulated(capacity=.5GiB)", 20, "bad size `.5GiB`");
    fails("simulated(capacity = lots)", 22, "bad size `lots`");
    fails(
        "simulated(capacity=99999999999TiB)",
        20,
        "does not fit in 64 bits",
    );
    fails("simulated(capacity=-1)", 20, "bad size `-1`");
    fails(
        "cuda(device=first)",
        13,
        "bad value `first` for `cuda.device`: expected a whole number",
    );
}

#[test]
fn names_and_fields_are_checked() {
    use ConfigErrorKind as K;
    let e = fails("simulated", 1, "`simulated` needs the field `capacity`");
    assert!(matches!(e.kind, K::MissingField { .. }));
    fails(
        "simulated(capacity=1GiB, cap=3)",
        26,
        "`simulated` has no field `cap`; it takes capacity",
    );
    fails("system(x=1)", 8, "`system` has no field `x`; it takes none");
    fails(
        "cuda_async(device=0, threshold=1GiB)",
        22,
        "it takes device, initial, release_threshold, exportable",
    );
    let e = fails(
        "simulatd(capacity=1GiB)",
        1,
        "unknown resource or adaptor `simulatd`; known: cuda, cuda_async, cuda_async_view, cuda_async_managed, managed, pinned, sam_headroom, system, simulated, vmm, paged, pool,",
    );
    assert!(matches!(e.kind, K::Unknown { .. }));
    assert!(e.to_string().ends_with(", count"), "{e}");
    fails(
        "simulated(capacity=1GiB) > frobnicate",
        28,
        "unknown resource or adaptor `frobnicate`",
    );
    fails(
        "simulated(capacity=1GiB) > system",
        28,
        "`system` is a leaf resource: only the first item may be one",
    );
    fails(
        "count(label=a) > system",
        1,
        "`count` is an adaptor: it needs a leaf resource before it, as in `cuda > count`",
    );
    fails(
        "simulated(capacity=1GiB) > count",
        28,
        "`count` needs the field `label`",
    );
    fails(
        "simulated(capacity=1GiB) > count(label=a, size=3)",
        43,
        "`count` has no field `size`; it takes label",
    );
}

#[test]
fn columns_count_characters() {
    fails(
        "simulated(capacity=1KiB) > count(label=\"é\") > frobnicate",
        47,
        "frobnicate",
    );
}

#[test]
fn custom_adaptors_replace_by_name_and_are_listed() {
    let b = builder::<()>().with_adaptor("count", |item, below| {
        item.check_fields(&[])?;
        Ok(below)
    });
    assert_eq!(b.names().iter().filter(|n| **n == "count").count(), 1);
    assert!(b.build("simulated(capacity=1KiB) > count").is_ok());
    assert!(StackBuilder::<()>::without_adaptors()
        .build("simulated(capacity=1KiB) > count")
        .is_err());
    assert!(format!("{b:?}").contains("count"));
}

fn name() -> impl Strategy<Value = String> {
    "[a-z_][a-z0-9_]{0,8}"
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,6} ?(KiB|MiB|GB)?",
        "[ -~]{0,12}",
        "[a-zé,()>=\"\\\\ ]{0,8}",
    ]
}

fn item() -> impl Strategy<Value = (String, Vec<(String, String)>)> {
    (
        name(),
        proptest::collection::btree_map(name(), value(), 0..4),
    )
        .prop_map(|(n, fields)| (n, fields.into_iter().collect()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Printing a stack and parsing the text gives the same items, fields and values back.
    #[test]
    fn printed_stacks_read_back(items in proptest::collection::vec(item(), 1..5)) {
        let text = items
            .iter()
            .map(|(n, fields)| {
                let spec = mrstack::config::ItemSpec {
                    name: n.clone(),
                    position: 0,
                    fields: fields
                        .iter()
                        .map(|(k, v)| mrstack::config::FieldSpec {
                            name: k.clone(),
                            value: v.clone(),
                            position: 0,
                            value_position: 0,
                        })
                        .collect(),
                };
                spec.to_string()
            })
            .collect::<Vec<_>>()
            .join(" > ");
        let spec: StackSpec = text.parse().map_err(|e| TestCaseError::fail(format!("{text:?}: {e}")))?;
        prop_assert_eq!(spec.to_string(), text.clone());
        prop_assert_eq!(spec.items.len(), items.len());
        for (got, (n, fields)) in spec.items.iter().zip(&items) {
            prop_assert_eq!(&got.name, n);
            let got: Vec<_> = got.fields.iter().map(|f| (f.name.clone(), f.value.clone())).collect();
            prop_assert_eq!(&got, fields);
        }
    }

    /// Any text at all gives a stack or an error inside the text, never a panic.
    #[test]
    fn any_text_is_an_answer_not_a_panic(text in "[a-z_()=,>\" 0-9KiBM]{0,40}") {
        let chars = text.chars().count();
        match text.parse::<StackSpec>() {
            Ok(spec) => {
                prop_assert!(!spec.items.is_empty());
                if let Err(e) = builder::<()>().build_spec(&spec) {
                    prop_assert!(e.position <= chars);
                }
            }
            Err(e) => prop_assert!(e.position <= chars, "{e} in {text:?}"),
        }
    }
}

#[test]
fn the_issue_example_builds_a_pool_and_bins() {
    // The example stack of the configuration text, over a simulated device instead of CUDA.
    let mr = config::build::<()>(
        "simulated(capacity=16GiB) > pool(initial=1GiB,max=8GiB) > binning(min=256KiB,max=4MiB) > statistics",
    )
    .unwrap();
    assert_eq!(mr.name(), "Statistics");
    let small = mr.allocate(300 << 10, 256, S).unwrap();
    let large = mr.allocate(64 << 20, 256, S).unwrap();
    assert_ne!(small, large);
    // SAFETY: both came from mr with these sizes and alignments.
    unsafe {
        mr.deallocate(small, 300 << 10, 256, S);
        mr.deallocate(large, 64 << 20, 256, S);
    }
    let arena =
        config::build::<()>("simulated(capacity=1GiB) > arena(size=256MiB, superblock=1MiB)")
            .unwrap();
    let p = arena.allocate(1000, 256, S).unwrap();
    // SAFETY: p came from arena with this size and align.
    unsafe { arena.deallocate(p, 1000, 256, S) };
    let fixed = config::build::<()>(
        "simulated(capacity=1GiB) > fixed_size(block_size=64KiB, blocks_to_preallocate=4)",
    )
    .unwrap();
    crate::support::serve_one(&fixed, 1000, 256, S);
    let e = fixed.allocate(128 << 10, 256, S).unwrap_err();
    assert!(matches!(e.kind, AllocErrorKind::InvalidArgument(_)), "{e}");

    let e = config::build::<()>("simulated(capacity=1GiB) > pool(maximum=1GiB)").unwrap_err();
    assert!(e.to_string().contains("maximum"), "{e}");
    let e = config::build::<()>("simulated(capacity=1GiB) > pool(max=1 GiBi)").unwrap_err();
    assert!(e.to_string().contains("GiBi"), "{e}");
}

#[test]
fn behaviour_adaptors_from_text() {
    let dir = std::env::temp_dir().join(format!("mrstack-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("alloc.csv");
    let text = format!(
        "system > aligned(alignment=4096) > limiting(limit=1MiB) > tracking > logging(path=\"{}\")",
        log.display()
    );
    let mr = config::build::<HostAccessible>(&text).unwrap();
    let p = mr.allocate(100, 8, S).unwrap();
    assert_eq!(p.as_ptr() as usize % 4096, 0);
    let e = mr.allocate(2 << 20, 8, S).unwrap_err();
    assert!(
        matches!(
            e.kind,
            AllocErrorKind::LimitExceeded {
                limit: 1_048_576,
                ..
            }
        ),
        "{e}"
    );
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate(p, 100, 8, S) };
    drop(mr);
    let csv = std::fs::read_to_string(&log).unwrap();
    assert!(
        csv.starts_with("Thread,Time,Action,Pointer,Size,Stream"),
        "{csv}"
    );
    assert_eq!(
        csv.lines().filter(|l| l.contains(",allocate,")).count(),
        1,
        "{csv}"
    );
    assert_eq!(
        csv.lines().filter(|l| l.contains(",free,")).count(),
        1,
        "{csv}"
    );
    std::fs::remove_dir_all(&dir).unwrap();

    let e = config::build::<()>("simulated(capacity=1GiB) > aligned(alignment=300)").unwrap_err();
    assert!(e.to_string().contains("256, 512, 1024 or 4096"), "{e}");
    let e = config::build::<()>("simulated(capacity=1GiB) > limiting").unwrap_err();
    assert!(e.to_string().contains("limit"), "{e}");
    let e =
        config::build::<()>("simulated(capacity=1GiB) > tracking(backtraces=maybe)").unwrap_err();
    assert!(e.to_string().contains("true or false"), "{e}");
    // Prefetch needs managed memory below it: a clear error, not a panic, over anything else.
    let e = config::build::<()>("simulated(capacity=1GiB) > prefetch").unwrap_err();
    assert!(matches!(e.kind, ConfigErrorKind::Properties { .. }), "{e}");
}

/// The capacity of the `Simulated` leaf `text` builds.
fn capacity(text: &str) -> usize {
    let mr = config::build::<()>(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    mr.downcast_ref::<Simulated>().unwrap().capacity()
}

#[test]
fn sizes_follow_holoscans_convention() {
    // KB/MB/GB/TB are powers of 1024, as Holoscan and PyTorch read them.
    assert_eq!(capacity("simulated(capacity=512MB)"), 512 << 20);
    assert_eq!(capacity("simulated(capacity=512MiB)"), 512 << 20);
    assert_eq!(capacity("simulated(capacity=64 KB)"), 64 << 10);
    assert_eq!(capacity("simulated(capacity=2TB)"), 2 << 40);
    // Decimals are truncated to whole bytes, quoted or not.
    assert_eq!(capacity("simulated(capacity=1.5GB)"), 3 << 29);
    assert_eq!(capacity("simulated(capacity=\"0.3 KiB\")"), 307);
    assert_eq!(capacity("simulated(capacity=1_000.75)"), 1000);
}

/// `simulated(capacity=1GiB)` and `adaptors` statistics adaptors over it.
fn statistics_stack(adaptors: usize) -> String {
    let mut text = String::from("simulated(capacity=1GiB)");
    for _ in 0..adaptors {
        text.push_str(" > statistics");
    }
    text
}

#[test]
fn a_stack_has_at_most_max_items() {
    assert_eq!(config::MAX_ITEMS, 64);
    // The leaf and 63 adaptors: built, and it allocates through every layer.
    let mr = config::build::<()>(&statistics_stack(63)).unwrap();
    crate::support::serve_one(&mr, 1 << 20, 256, S);
    // One more is refused at the column of the 65th item: 24 characters of leaf, then 63 times
    // " > statistics" (13), then " > ".
    let column = 24 + 63 * 13 + 3 + 1;
    for adaptors in [64, 80_000] {
        let e = fails(
            &statistics_stack(adaptors),
            column,
            "a stack has at most 64 items (the leaf and 63 adaptors); this is item 65",
        );
        assert_eq!(e.kind, ConfigErrorKind::TooDeep { limit: 64 });
    }
    // The bound holds for a spec built without text too.
    let spec: StackSpec = statistics_stack(100).parse().unwrap();
    let e = StackBuilder::<()>::new().build_spec(&spec).unwrap_err();
    assert_eq!(e.position, column - 1);
}

#[test]
fn many_fields_in_one_item_are_parsed_in_one_pass() {
    // 200,000 distinct fields: a linear search for duplicates per field would take 2·10^10
    // comparisons; a set of the names seen takes one look-up per field.
    const FIELDS: usize = 200_000;
    let mut text = String::from("simulated(");
    for i in 0..FIELDS {
        text.push_str(&format!("f{i}={i}, "));
    }
    text.push_str("capacity=1MiB)");
    let spec: StackSpec = text.parse().unwrap();
    assert_eq!(spec.items[0].fields.len(), FIELDS + 1);
    assert_eq!(
        spec.items[0].fields[FIELDS - 1].name,
        format!("f{}", FIELDS - 1)
    );
    assert_eq!(spec.items[0].size("capacity").unwrap(), Some(1 << 20));
    // Refused for its first unknown field, at its column.
    fails(
        &text,
        11,
        "`simulated` has no field `f0`; it takes capacity",
    );
    // A repeated name at the very end is still found, at its column.
    let repeated = text.replace("capacity=1MiB)", "f0=1)");
    let e = repeated.parse::<StackSpec>().unwrap_err();
    assert_eq!(
        e.kind,
        ConfigErrorKind::DuplicateField {
            item: "simulated".into(),
            field: "f0".into()
        }
    );
    assert_eq!(e.position, repeated.len() - "f0=1)".len());
}

#[test]
fn contradictory_fields_are_errors_at_the_later_field() {
    use ConfigErrorKind as K;
    let e = fails(
        "simulated(capacity=1GiB) > pool(initial=2MiB, max=1MiB)",
        47,
        "`pool.initial` (2.00 MiB) is above `pool.max` (1.00 MiB)",
    );
    assert!(matches!(e.kind, K::Contradiction { .. }), "{e}");
    // Written the other way round: at `initial`, the later one.
    fails(
        "simulated(capacity=1GiB) > pool(max=1MiB, initial=2MiB)",
        43,
        "`pool.initial` (2.00 MiB) is above `pool.max` (1.00 MiB)",
    );
    fails(
        "simulated(capacity=1GiB) > binning(min=4MiB, max=256KiB)",
        46,
        "`binning.min` (4.00 MiB) is above `binning.max` (256.00 KiB)",
    );
    // Against a default (`min` is 256 bytes): at the field written.
    fails(
        "simulated(capacity=1GiB) > binning(max=128)",
        36,
        "`binning.min` (256 B) is above `binning.max` (128 B)",
    );
    // Equal bounds are fine.
    assert!(config::build::<()>("simulated(capacity=1GiB) > pool(initial=1MiB, max=1MiB)").is_ok());
    assert!(config::build::<()>("simulated(capacity=1GiB) > binning(min=1MiB, max=1MiB)").is_ok());
    // A `max` below the smallest bin leaves none (and `min` would describe as 256 B, above it).
    for text in [
        "simulated(capacity=1GiB) > binning(min=0, max=0)",
        "simulated(capacity=1GiB) > binning(min=1, max=100)",
    ] {
        let e = config::build::<()>(text).unwrap_err().to_string();
        assert!(
            e.contains("below its smallest bin (256 bytes)"),
            "{text}: {e}"
        );
    }
}

#[test]
fn suballocators_from_text_reserve_now_or_fail() {
    type Below = AnyResource<()>;
    // The initial reservation is taken when the stack is built.
    let mr = config::build::<()>("simulated(capacity=1GiB) > pool(initial=2MiB)").unwrap();
    let pool = mr.downcast_ref::<Pool<Below>>().unwrap();
    assert_eq!(pool.usage().held, 2 << 20);
    // One the upstream refuses is an error at the item, not a pool that starts empty.
    for (text, column) in [
        ("simulated(capacity=1MiB) > pool(initial=2MiB)", 28),
        ("simulated(capacity=1MiB) > arena(size=2MiB)", 28),
        (
            "simulated(capacity=1MiB) > statistics > fixed_size(block_size=1MiB, blocks_to_preallocate=4)",
            41,
        ),
    ] {
        let e = fails(text, column, "could not be built: ");
        assert!(matches!(e.kind, ConfigErrorKind::Resource { .. }), "{e}");
    }
}

/// An item name: mostly ones the builder knows, some it does not, some junk. Not `logging`, which
/// writes its header to stderr (or, given a `path`, creates a file).
fn fuzz_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "simulated", "system", "cuda", "cuda_async", "cuda_async_view", "cuda_async_managed",
            "managed", "pinned", "pool", "binning",
            "fixed_size", "arena", "statistics", "tracking", "limiting", "aligned",
            "prefetch",
        ])
        .prop_map(String::from),
        1 => "[a-zA-Z_][a-zA-Z0-9_]{0,6}",
        1 => "\\PC{0,3}",
    ]
}

/// A field name: mostly ones some item takes, never `path` (`logging`'s file).
fn fuzz_field() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec![
            "capacity", "device", "initial", "max", "min", "release_threshold", "block_size",
            "blocks_to_preallocate", "size", "superblock", "limit", "backtraces", "alignment",
        ])
        .prop_map(String::from),
        1 => "[a-z_][a-z0-9_]{0,6}".prop_filter("no files", |n| n != "path"),
        1 => "\\PC{0,3}",
    ]
}

/// A value: sizes in every form (small ones, so that a leaf that really allocates stays cheap,
/// and absurd ones), numbers, flags, quoted text with escapes, junk.
fn fuzz_value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => ("[0-9]{1,4}(\\.[0-9]{0,3})?", prop::sample::select(vec!["", "B", " KiB", "KB", "MiB", " MB", "GiB", "GB", "TiB", "TB", "XB", "gib"]))
            .prop_map(|(n, u)| format!("{n}{u}")),
        1 => prop::sample::select(vec![
            "99999999999TiB", "18446744073709551615", "18446744073709551616", "0", "1_", "_1",
            "1..5MiB", "-1", "1e3", "4096", "256", "true", "false", "maybe",
        ])
        .prop_map(String::from),
        1 => "\"([^\"\\\\]|\\\\[\"\\\\]){0,8}\"?",
        1 => "\\PC{0,6}",
        1 => "[\\x00-\\x7f]{0,6}",
    ]
}

/// An item as text: a name and maybe fields, with now and then a junk string cut in.
fn fuzz_item() -> impl Strategy<Value = String> {
    (
        fuzz_name(),
        proptest::option::of(proptest::collection::vec(
            (fuzz_field(), fuzz_value()),
            0..5,
        )),
        proptest::option::weighted(0.1, "[()=,>\" \\\\]{1,4}|\\PC{1,4}"),
    )
        .prop_map(|(name, fields, junk)| {
            let mut text = name;
            if let Some(fields) = fields {
                let fields: Vec<String> = fields.iter().map(|(f, v)| format!("{f}={v}")).collect();
                text.push('(');
                text.push_str(&fields.join(", "));
                text.push(')');
            }
            if let Some(junk) = junk {
                text.push_str(&junk);
            }
            text
        })
}

/// A stack as text: a few items, or now and then many (beyond `MAX_ITEMS`), or deep in `(`.
fn fuzz_text() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => proptest::collection::vec(fuzz_item(), 1..6).prop_map(|items| items.join(" > ")),
        1 => (fuzz_item(), 55..80usize).prop_map(|(item, n)| {
            let mut text = String::from("simulated(capacity=1GiB)");
            for _ in 0..n {
                text.push_str(" > ");
                text.push_str(&item);
            }
            text
        }),
        1 => (1..200usize, fuzz_item()).prop_map(|(n, item)| format!("{}{item}{}", "(".repeat(n), ")".repeat(n))),
        1 => "\\PC{0,40}",
    ]
}

proptest! {
    // 512 cases by default take about a second; `PROPTEST_CASES=…` runs more.
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random config texts through `config::build`: every outcome is a stack or an error whose
    /// column lies within the text (or at its end), never a panic.
    #[test]
    fn random_configs_build_or_fail_inside_the_text(text in fuzz_text()) {
        if let Err(e) = config::build::<()>(&text) {
            prop_assert!(e.position <= text.chars().count(), "{e} in {text:?}");
            prop_assert!(!e.to_string().is_empty());
        }
    }
}

/// A caller's `FromItem` configuration cannot launder properties: its layer, over a stack that
/// gives host memory, serves from a resource that gives none, and is refused at its column when
/// the stack must give host memory.
#[test]
fn a_callers_layer_cannot_claim_what_its_resource_lacks() {
    use mrstack::config::{FromItem, ItemSpec};

    /// Ignores the stack below and serves address ranges with no memory behind them.
    struct NothingInstead;
    impl FromItem for NothingInstead {
        fn from_item(item: &ItemSpec) -> Result<Self, ConfigError> {
            item.check_fields(&[])?;
            Ok(NothingInstead)
        }
    }
    impl<U: MemoryResource> Layer<U> for NothingInstead {
        type Resource = Simulated;
        fn layer(self, _: U) -> Simulated {
            Simulated::new(1 << 20)
        }
    }
    let text = "system > nothing_instead";
    let untyped = StackBuilder::<()>::new().with_layer::<NothingInstead>("nothing_instead");
    assert!(untyped.build(text).is_ok());
    let host =
        StackBuilder::<HostAccessible>::new().with_layer::<NothingInstead>("nothing_instead");
    let err = host
        .build(text)
        .expect_err("no memory never passes as host memory");
    assert!(
        matches!(err.kind, ConfigErrorKind::Properties { .. }),
        "{err}"
    );
    assert_eq!(err.position, 9, "{err}");
}
