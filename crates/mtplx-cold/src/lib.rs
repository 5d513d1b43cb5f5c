//! mtplx-cold: see ARCHITECTURE.md.
