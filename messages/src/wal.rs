//! What the metadata write-ahead log stores: the writes of a group commit,
//! one [`Change`] each (a record's payload is a postcard `Vec<Change>`).

use std::ops::Bound;

use serde::{Deserialize, Serialize};

/// One write to a table of a metadata environment (tables by number).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    Put {
        table: u8,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        table: u8,
        key: Vec<u8>,
    },
    DeleteRange {
        table: u8,
        start: Bound<Vec<u8>>,
        end: Bound<Vec<u8>>,
    },
}
