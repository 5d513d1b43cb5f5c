//! mtplx-bank: see ARCHITECTURE.md.
