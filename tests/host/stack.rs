//! Host tests of stacks seen whole: descriptions of macro and text stacks (and that a text stack's
//! description builds the same stack again), layers reached by type at compile time (`reach`) and
//! at run time through erased layers (`find`), a stack of a leaf alone, and the sizes
//! `resource_stack!` fields take.

// resource_stack! always adds `..Default::default()`, which clippy flags for a configuration whose
// every field is given.
#![allow(clippy::needless_update)]

use crate::leaves::zero_size_is_dangling;
use crate::support::files::TempFile;
use mrstack::adaptor::Retry;
use mrstack::config::{self, StackBuilder};
use mrstack::erased::{AnyResource, ResourceRef};
use mrstack::prelude::*;
use mrstack::resource::AllocErrorKind;
use mrstack::stack::{AnyLayer, HasLayer, Reach};
use mrstack::{
    adaptor::{Aligned, Limiting, Logging, Statistics, Tracking},
    suballoc::{Arena, Binning, FixedSize, Pool},
};
use proptest::prelude::*;
use std::sync::Arc;
use typenum::U4096;

const S: StreamRef = StreamRef::DEFAULT;

/// `text` built, described, and the description built and described again: both descriptions
/// must be `expected`.
fn round_trip<P: mrstack::property::PropertySet>(text: &str, expected: &str) {
    let mr = config::build::<P>(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert_eq!(mr.describe().to_string(), expected, "built from {text:?}");
    let again = config::build::<P>(expected).unwrap_or_else(|e| panic!("{expected:?}: {e}"));
    assert_eq!(
        again.describe().to_string(),
        expected,
        "rebuilt from {expected:?}"
    );
}

// ------------------------------------------------------------------------------ descriptions

#[test]
fn a_macro_stack_describes_every_layer_leaf_first() {
    let mr = resource_stack![
        Simulated::new(8 << 30),
        Pool { initial: 64 MiB, max: 512 MiB },
        Binning { min: 256 B, max: 1 MiB },
        Limiting { limit: 6 GiB },
        Tracking,
        Statistics,
        Aligned<U4096>,
    ];
    let text = "simulated(capacity=8 GiB) > pool(initial=64 MiB, max=512 MiB) > \
                binning(min=256 B, max=1 MiB) > limiting(limit=6 GiB) > tracking > statistics > \
                aligned(alignment=4096)";
    assert_eq!(mr.describe().to_string(), text);
    assert_eq!(
        format!("{:?}", mr.describe()),
        format!("Description({text})")
    );
    // Every layer has a text form: the same text builds the same stack.
    round_trip::<()>(text, text);
    // The top layer's name alone, as before: what errors and logs show.
    assert_eq!(mr.name(), "Aligned");
}

#[test]
fn configurations_show_as_text_reads_them() {
    let sim = Simulated::new(1 << 30);
    // Defaults that text leaves out are left out; sizes are exact, in the largest unit that
    // divides them; rounding done by the resource shows.
    let cases: Vec<(String, &str)> = vec![
        (
            resource_stack![&sim, Pool].describe().to_string(),
            "simulated(capacity=1 GiB) > pool",
        ),
        (
            resource_stack![&sim, Pool { initial: 1000 B, max: 1.5 GiB }]
                .describe()
                .to_string(),
            "simulated(capacity=1 GiB) > pool(initial=1 KiB, max=1536 MiB)",
        ),
        (
            resource_stack![&sim, Binning { min: 100 B, max: 3 MiB }]
                .describe()
                .to_string(),
            "simulated(capacity=1 GiB) > binning(min=256 B, max=4 MiB)",
        ),
        (
            resource_stack![
                &sim,
                FixedSize {
                    block_size: 1000 B,
                    blocks_to_preallocate: 0
                }
            ]
            .describe()
            .to_string(),
            "simulated(capacity=1 GiB) > fixed_size(block_size=1 KiB, blocks_to_preallocate=0)",
        ),
        (
            resource_stack![&sim, Arena { size: 256 MiB, superblock: 1 MiB }]
                .describe()
                .to_string(),
            "simulated(capacity=1 GiB) > arena(size=256 MiB, superblock=1 MiB)",
        ),
        (
            resource_stack![System::new(), Tracking { backtraces: true }]
                .describe()
                .to_string(),
            "system > tracking(backtraces=true)",
        ),
        (
            resource_stack![System::new(), Limiting { limit: 1000 B }]
                .describe()
                .to_string(),
            "system > limiting(limit=1000 B)",
        ),
    ];
    for (described, expected) in cases {
        assert_eq!(described, expected);
        round_trip::<()>(expected, expected);
    }
}

#[test]
fn layers_without_a_text_form_still_show() {
    let retry = Retry::new(System::new(), |_: &AllocError, attempt: usize| attempt < 2);
    assert_eq!(retry.describe().to_string(), "system > retry");
    // A writer the adaptor did not open is not named.
    let logging = Logging::new(resource_stack![System::new(), Statistics], Vec::new());
    assert_eq!(
        logging.describe().to_string(),
        "system > statistics > logging"
    );
    // A resource of the caller's that does not describe itself shows its name.
    let callback = crate::callback::heap();
    assert_eq!(
        resource_stack![&callback, Statistics]
            .describe()
            .to_string(),
        format!("{} > statistics", callback.name())
    );
}

#[test]
fn a_log_file_is_named_and_quoted_when_it_must_be() {
    let file = TempFile::new("mrstack-describe", "a, (b).csv", b"");
    let path = file.text();
    let mr = Logging::create(System::new(), path).unwrap();
    let expected = format!("system > logging(path=\"{path}\")");
    assert_eq!(mr.describe().to_string(), expected);
    // The text builder keeps the path too, and reads the quoted description back.
    round_trip::<HostAccessible>(&expected, &expected);
    let plain = TempFile::new("mrstack-describe", "plain.csv", b"");
    let text = format!("system > logging(path={})", plain.text());
    round_trip::<HostAccessible>(&text, &text);
}

#[test]
fn pointers_and_erased_handles_do_not_show() {
    let sim = Simulated::new(1 << 30);
    let expected = "simulated(capacity=1 GiB) > pool > statistics";
    let by_ref = resource_stack![&sim, Pool, Statistics];
    assert_eq!(by_ref.describe().to_string(), expected);
    // `&R` is the resource it borrows.
    let borrowed = &by_ref;
    assert_eq!(MemoryResource::describe(&borrowed).to_string(), expected);
    let shared = Arc::new(resource_stack![Simulated::new(1 << 30), Pool]);
    let over_arc = resource_stack![shared.clone(), Statistics];
    assert_eq!(over_arc.describe().to_string(), expected);
    let any = AnyResource::<()>::from_arc(shared);
    assert_eq!(
        resource_stack![any.clone(), Statistics]
            .describe()
            .to_string(),
        expected
    );
    assert_eq!(
        ResourceRef::<()>::new(&by_ref).describe().to_string(),
        expected
    );
}

#[test]
fn text_stacks_round_trip_through_their_description() {
    let log = TempFile::new("mrstack-describe", "round.csv", b"");
    let cases = [
        (
            "simulated(capacity=1GiB)",
            "simulated(capacity=1 GiB)".to_string(),
        ),
        (
            "simulated(capacity=1.5GB) > pool(initial=1MiB,max=8MiB) > binning > statistics",
            "simulated(capacity=1536 MiB) > pool(initial=1 MiB, max=8 MiB) > \
             binning(min=256 B, max=1 MiB) > statistics"
                .to_string(),
        ),
        (
            "simulated(capacity=1GiB) > fixed_size(block_size=4KiB, blocks_to_preallocate=3) > \
             limiting(limit=10000)",
            "simulated(capacity=1 GiB) > fixed_size(block_size=4 KiB, blocks_to_preallocate=3) > \
             limiting(limit=10000 B)"
                .to_string(),
        ),
        (
            "simulated(capacity=1GiB) > arena(size=64MiB) > tracking(backtraces=false) > \
             aligned(alignment=1024)",
            "simulated(capacity=1 GiB) > arena(size=64 MiB, superblock=4 MiB) > tracking > \
             aligned(alignment=1024)"
                .to_string(),
        ),
        (
            "simulated(capacity=1GiB) > thread_heaps(max=512MiB) > statistics",
            "simulated(capacity=1 GiB) > thread_heaps(max=512 MiB) > statistics".to_string(),
        ),
        ("system > thread_heaps", "system > thread_heaps".to_string()),
        (
            &*format!("system > statistics > logging(path={})", log.text()),
            format!("system > statistics > logging(path={})", log.text()),
        ),
    ];
    for (text, expected) in &cases {
        round_trip::<()>(text, expected);
    }
    // A stack that must give host memory round-trips under that property too.
    round_trip::<HostAccessible>("system > pool", "system > pool");
}

#[test]
fn an_adaptor_registered_by_its_configuration_shows_as_its_resource() {
    // `cap(bytes=…)` builds a Limiting: it describes itself as the resource it is, which the
    // default builder builds again.
    struct Cap(usize);
    impl config::FromItem for Cap {
        fn from_item(item: &config::ItemSpec) -> Result<Self, config::ConfigError> {
            item.check_fields(&["bytes"])?;
            Ok(Cap(item.required_size("bytes")?))
        }
    }
    impl<U: MemoryResource> Layer<U> for Cap {
        type Resource = mrstack::adaptor::Limiting<U>;
        fn layer(self, upstream: U) -> Self::Resource {
            mrstack::adaptor::Limiting::new(upstream, self.0)
        }
    }
    let mr = StackBuilder::<()>::new()
        .with_layer::<Cap>("cap")
        .build("simulated(capacity=1MiB) > cap(bytes=4KiB)")
        .unwrap();
    let expected = "simulated(capacity=1 MiB) > limiting(limit=4 KiB)";
    assert_eq!(mr.describe().to_string(), expected);
    round_trip::<()>(expected, expected);
}

/// One item of a random text stack over `simulated`, with random fields, as text.
fn item() -> impl Strategy<Value = String> {
    let size = prop_oneof![
        (0usize..5000).prop_map(|n| n.to_string()),
        (1usize..64).prop_map(|n| format!("{n}KiB")),
        (1usize..64).prop_map(|n| format!("{n} MiB")),
        (1usize..4).prop_map(|n| format!("{n}.5GB")),
    ];
    let sizes = (size.clone(), size.clone());
    prop_oneof![
        Just("statistics".to_string()),
        Just("tracking".to_string()),
        Just("tracking(backtraces=true)".to_string()),
        size.clone().prop_map(|l| format!("limiting(limit={l})")),
        (0usize..4).prop_map(|i| format!("aligned(alignment={})", [256, 512, 1024, 4096][i])),
        sizes
            .clone()
            .prop_map(|(a, b)| format!("pool(initial={a}, max={b})")),
        size.clone().prop_map(|m| format!("pool(max={m})")),
        size.clone().prop_map(|m| format!("thread_heaps(max={m})")),
        sizes
            .clone()
            .prop_map(|(a, b)| format!("binning(min={a}, max={b})")),
        (size.clone(), 0usize..3)
            .prop_map(|(b, n)| format!("fixed_size(block_size={b}, blocks_to_preallocate={n})")),
        sizes.prop_map(|(a, b)| format!("arena(size={a}, superblock={b})")),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever stack text builds, its description builds a stack with the same description.
    #[test]
    fn every_text_stack_round_trips(items in proptest::collection::vec(item(), 0..6)) {
        let text = std::iter::once("simulated(capacity=64GiB)".to_string())
            .chain(items)
            .collect::<Vec<_>>()
            .join(" > ");
        // Contradictory fields (a pool's initial above its max) are errors, not stacks.
        if let Ok(mr) = config::build::<()>(&text) {
            let described = mr.describe().to_string();
            let again = config::build::<()>(&described)
                .unwrap_or_else(|e| panic!("{text:?} described as {described:?}: {e}"));
            prop_assert_eq!(again.describe().to_string(), described);
        }
    }
}

// ------------------------------------------------------------------------- reaching a layer

/// Generic code can ask for a layer in a bound: any stack with a `Statistics` somewhere in it.
fn peak_of<S, U, I>(stack: &S) -> i128
where
    S: HasLayer<Statistics<U>, I>,
{
    stack.layer_ref().stats().bytes.peak
}

#[test]
fn reach_finds_each_layer_of_a_macro_stack_by_its_type() {
    let sim = Simulated::new(1 << 30);
    let mr = resource_stack![&sim, Pool { initial: 2 MiB }, Tracking, Statistics, Limiting { limit: 1 GiB }];
    let p = mr.allocate(4096, 256, S).unwrap();
    let stats: &Statistics<_> = mr.reach();
    assert_eq!(stats.stats().bytes.current, 4096);
    assert_eq!(mr.reach::<Tracking<_>, _>().outstanding_bytes(), 4096);
    assert_eq!(mr.reach::<Pool<_>, _>().usage().allocated, 4096);
    assert_eq!(mr.reach::<Limiting<_>, _>().in_use(), 4096);
    // Through the `&sim` layer to the leaf itself.
    let leaf: &Simulated = mr.reach();
    assert!(std::ptr::eq(leaf, &sim));
    assert_eq!(peak_of(&mr), 4096);
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate(p, 4096, 256, S) };
    assert_eq!(mr.reach::<Tracking<_>, _>().outstanding_count(), 0);
    // An Arc in the middle is gone through as well.
    let shared = Arc::new(resource_stack![Simulated::new(1 << 20), Statistics]);
    let over = resource_stack![shared.clone(), Pool];
    let inner: &Statistics<Simulated> = over.reach();
    assert!(std::ptr::eq(inner, &*shared));
}

#[test]
fn find_walks_a_macro_stack_top_first() {
    let mr = resource_stack![Simulated::new(1 << 30), Pool, Binning, Statistics];
    let p = mr.allocate(1000, 256, S).unwrap();
    let stats = mr.find::<Statistics<Binning<Pool<Simulated>>>>().unwrap();
    assert_eq!(stats.stats().bytes.current, 1000);
    assert_eq!(mr.find::<Simulated>().unwrap().live(), 1);
    assert!(mr.find::<Tracking<Simulated>>().is_none());
    let names: Vec<&str> = mr.layers().map(AnyLayer::type_name).collect();
    assert_eq!(names.len(), 4);
    assert!(names[0].contains("Statistics"));
    assert!(names[3].ends_with("Simulated"));
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate(p, 1000, 256, S) };
}

#[test]
fn find_goes_through_erased_layers_and_stops_at_pointers() {
    // An erased macro stack: the erasure is a layer, and what it holds is found below it.
    let any = AnyResource::<()>::new(resource_stack![Simulated::new(1 << 30), Pool, Statistics]);
    assert!(any.find::<AnyResource<()>>().is_some());
    assert!(any.find::<Statistics<Pool<Simulated>>>().is_some());
    assert_eq!(any.find::<Simulated>().unwrap().capacity(), 1 << 30);
    assert_eq!(any.layers().count(), 4);
    // A pointer is found as itself; the walk does not go past it (its target may be unsized).
    let shared = Arc::new(Simulated::new(1 << 20));
    let over_arc = resource_stack![shared.clone(), Pool];
    assert!(Arc::ptr_eq(
        over_arc.find::<Arc<Simulated>>().unwrap(),
        &shared
    ));
    assert!(over_arc.find::<Simulated>().is_none());
    assert_eq!(over_arc.layers().count(), 2);
    // A ResourceRef ends the walk: it borrows, and `Any` needs `'static`.
    let r = ResourceRef::<'static, ()>::new(&*Box::leak(Box::new(Simulated::new(1 << 20))));
    assert_eq!(r.layers().count(), 1);
}

#[test]
fn find_reaches_every_layer_type_of_a_text_stack() {
    let log = TempFile::new("mrstack-describe", "find.csv", b"");
    let text = format!(
        "system > pool(initial=1MiB) > arena(size=8MiB) > fixed_size(block_size=64KiB) > \
         binning(max=16KiB) > limiting(limit=1GiB) > aligned(alignment=4096) > \
         logging(path={}) > tracking > statistics",
        log.text()
    );
    type A = AnyResource<HostAccessible>;
    let mr = config::build::<HostAccessible>(&text).unwrap();
    let p = mr.allocate(100, 8, S).unwrap();
    assert_eq!(mr.statistics().unwrap().stats().bytes.current, 100);
    assert_eq!(mr.tracking().unwrap().outstanding_bytes(), 100);
    // Nothing below gives 4096-byte alignment (fixed_size refuses it): `aligned` pads the request
    // by 4096 less the 16 bytes an erased layer guarantees, and the cap counts the padding.
    assert_eq!(mr.find::<Aligned<U4096, A>>().unwrap().over_allocated(), 1);
    assert_eq!(mr.find::<Limiting<A>>().unwrap().in_use(), 100 + 4096 - 16);
    assert!(mr.find::<Logging<A>>().is_some());
    assert_eq!(
        mr.find::<Binning<A>>().unwrap().bin_sizes().last(),
        Some(&(16 << 10))
    );
    assert_eq!(mr.find::<FixedSize<A>>().unwrap().block_size(), 64 << 10);
    assert_eq!(mr.find::<Arena<A>>().unwrap().max_size(), 8 << 20);
    // The arena took its whole size from the pool at once.
    assert_eq!(mr.find::<Pool<A>>().unwrap().usage().allocated, 8 << 20);
    assert!(mr.find::<System>().is_some());
    // Every item is one erased layer over its resource: 10 items, 20 layers.
    assert_eq!(mr.layers().count(), 20);
    assert_eq!(mr.layers().filter(|l| l.as_any().is::<A>()).count(), 10);
    // A type that is not there, or is there under another property set, is not found.
    assert!(mr.find::<Statistics<AnyResource<()>>>().is_none());
    assert!(mr.find::<Simulated>().is_none());
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate(p, 100, 8, S) };
    // A stack without the adaptor has none to give.
    let bare = config::build::<()>("simulated(capacity=1MiB) > pool").unwrap();
    assert!(bare.statistics().is_none() && bare.tracking().is_none());
}

#[test]
fn stack_of_a_leaf() {
    let sim = Simulated::new(1 << 30);
    let mr = resource_stack![&sim];
    let p = mr.allocate(1 << 20, 256, S).unwrap();
    assert_eq!(sim.in_use(), 1 << 20);
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate(p, 1 << 20, 256, S) };
    let owned: System = resource_stack![System::new(),];
    zero_size_is_dangling(&owned);
    // A borrowed temporary lives as long as `mr`, as `let mr = &Simulated::new(…);` would.
    let mr = resource_stack![&Simulated::new(1 << 20)];
    let p = mr.allocate(64, 8, S).unwrap();
    assert_eq!(mr.in_use(), 64);
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate(p, 64, 8, S) };
}

#[test]
fn macro_fields_take_sizes_literals_and_expressions() {
    let sim = Simulated::new(1 << 50);
    let shift = 30;
    let mr = resource_stack![
        &sim,
        Pool {
            initial: 1 << 20,
            max: 1 << shift
        },
        Limiting { limit: "512 MiB" },
    ];
    let e = mr.allocate(600 << 20, 256, S).unwrap_err();
    assert!(
        matches!(e.kind, AllocErrorKind::LimitExceeded { limit, .. } if limit == 512 << 20),
        "{e}"
    );
    let p = mr.allocate(1 << 20, 256, S).unwrap();
    assert_eq!(mr.upstream().usage().held, 1 << 20);
    // SAFETY: p came from mr with this size and align.
    unsafe { mr.deallocate(p, 1 << 20, 256, S) };
    let aligned = resource_stack![System::new(), Aligned<U4096>];
    let p = aligned.allocate(10, 1, S).unwrap();
    assert_eq!(p.as_ptr() as usize % 4096, 0);
    // SAFETY: p came from aligned with this size and align.
    unsafe { aligned.deallocate(p, 10, 1, S) };
}

#[test]
fn macro_size_literals_in_every_spelling() {
    let sim = Simulated::new(1 << 40);
    let limit = |mr: &Limiting<&Simulated>| {
        let e = mr.allocate(1 << 41, 256, S).unwrap_err();
        match e.kind {
            AllocErrorKind::LimitExceeded { limit, .. } => limit,
            other => panic!("{other:?}"),
        }
    };
    // The limit of a `Limiting` layer written `Limiting { limit: … }` with these tokens.
    macro_rules! limit_of {
        ($($limit:tt)*) => {
            limit(&resource_stack![&sim, Limiting { limit: $($limit)* }])
        };
    }
    assert_eq!(limit_of!(0x10 MiB), 16 << 20);
    assert_eq!(limit_of!(2KiB), 2048);
    assert_eq!(limit_of!(1_024 B), 1024);
    // An expression is bytes; a number literal alone needs its unit (tests/ui/size_without_unit.rs).
    let kib = 1024;
    assert_eq!(limit_of!(3 * kib), 3072);
    // KB/MB/GB/TB are powers of 1024, as Holoscan reads them.
    assert_eq!(limit_of!(3 GB), 3 << 30);
    assert_eq!(limit_of!("64 KB"), 64 << 10);
    // Decimals, truncated to whole bytes: as a literal and its unit, or as a string.
    assert_eq!(limit_of!(1.5 GiB), 3 << 29);
    assert_eq!(limit_of!(1.5GiB), 3 << 29);
    assert_eq!(limit_of!("1.5GB"), 3 << 29);
    assert_eq!(limit_of!(0.3 KiB), 307);
    // Both literal and in order: accepted.
    let pool = resource_stack![&sim, Pool { initial: 1 MiB, max: "2MB" }];
    assert_eq!(pool.usage().held, 1 << 20);
}
