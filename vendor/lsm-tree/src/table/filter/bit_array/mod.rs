// Copyright (c) 2024-present, fjall-rs
// This source code is licensed under both the Apache 2.0 and MIT License
// (found in the LICENSE-* files in the repository)

mod builder;
mod reader;

pub use builder::Builder;
pub use reader::BitArrayReader;
