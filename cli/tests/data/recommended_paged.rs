resource_stack![
    PagedHeaps::for_context(&ctx)?,
]
