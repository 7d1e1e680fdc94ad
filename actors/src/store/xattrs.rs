//! Extended attributes (`xattrs`: ino ++ name -> value).

use heed::RoTxn;

use crate::txn::WriteTxn;

use curvine_messages::codec::encode_versioned;
use curvine_messages::shard::XattrValue;
use curvine_messages::{check_xattr, now_ns, FsError, FsResult, Ino, XattrMode};

use super::keys::{key_ino, key_name, name_of_key};
use super::{decode, lmdb_err, ShardStore};

impl ShardStore {
    fn xattr_key(ino: Ino, name: &str) -> Vec<u8> {
        key_name(ino, name)
    }

    pub fn set_xattr(
        &self,
        wtxn: &mut WriteTxn,
        ino: Ino,
        name: &str,
        value: &[u8],
        mode: XattrMode,
    ) -> FsResult<()> {
        check_xattr(name, Some(value))?;
        let mut attr = self.getattr(wtxn, ino)?;
        let key = Self::xattr_key(ino, name);
        let exists = self.xattrs.get(wtxn, &key).map_err(lmdb_err)?.is_some();
        match (mode, exists) {
            (XattrMode::Create, true) => {
                return Err(FsError::AlreadyExists(format!("attribute {name}")))
            }
            (XattrMode::Replace, false) => {
                return Err(FsError::NoData(format!("attribute {name}")))
            }
            _ => {}
        }
        self.xattrs
            .put(wtxn, &key, &encode_versioned(&XattrValue(value.to_vec())))
            .map_err(lmdb_err)?;
        attr.ctime_ns = now_ns();
        self.put_inode(wtxn, &attr)
    }

    pub fn get_xattr(&self, txn: &RoTxn, ino: Ino, name: &str) -> FsResult<Vec<u8>> {
        check_xattr(name, None)?;
        self.getattr(txn, ino)?;
        match self
            .xattrs
            .get(txn, &Self::xattr_key(ino, name))
            .map_err(lmdb_err)?
        {
            Some(bytes) => Ok(decode::<XattrValue>(bytes)?.0),
            None => Err(FsError::NoData(format!("attribute {name}"))),
        }
    }

    pub fn list_xattr(&self, txn: &RoTxn, ino: Ino) -> FsResult<Vec<String>> {
        self.getattr(txn, ino)?;
        let mut names = Vec::new();
        for item in self
            .xattrs
            .prefix_iter(txn, &key_ino(ino))
            .map_err(lmdb_err)?
        {
            let (key, _) = item.map_err(lmdb_err)?;
            names.push(name_of_key(key));
        }
        Ok(names)
    }

    pub fn remove_xattr(&self, wtxn: &mut WriteTxn, ino: Ino, name: &str) -> FsResult<()> {
        check_xattr(name, None)?;
        let mut attr = self.getattr(wtxn, ino)?;
        if !self
            .xattrs
            .delete(wtxn, &Self::xattr_key(ino, name))
            .map_err(lmdb_err)?
        {
            return Err(FsError::NoData(format!("attribute {name}")));
        }
        attr.ctime_ns = now_ns();
        self.put_inode(wtxn, &attr)
    }
}
