"""The search loop: plan, studies, the compile-ahead pipeline, confirmation and progress."""
