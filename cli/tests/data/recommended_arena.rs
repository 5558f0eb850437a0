resource_stack![
    Cuda::new(&ctx)?,
    Arena { size: 2.8 GiB },
]
