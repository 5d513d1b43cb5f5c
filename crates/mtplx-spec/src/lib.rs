//! mtplx-spec: see ARCHITECTURE.md.
