//! POSIX ACLs (`--acl`): `system.posix_acl_access` and
//! `system.posix_acl_default` are extended attributes in the kernel's
//! format, stored like any other, and the kernel enforces them
//! (FUSE_POSIX_ACL, with default_permissions), keeps a file's access ACL
//! in step with chmod, and asks for them when it checks a permission. What
//! it leaves to the mount: a new inode inherits the default ACL of its
//! directory (Linux's `posix_acl_create`), and the umask applies only
//! where there is none.

/// The attribute of a file's access ACL.
pub(super) const ACCESS: &str = "system.posix_acl_access";
/// The attribute of a directory's default ACL.
pub(super) const DEFAULT: &str = "system.posix_acl_default";

/// `POSIX_ACL_XATTR_VERSION`.
const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

/// An ACL as the kernel encodes it in an extended attribute: a version,
/// then entries of tag, permissions and id (little-endian).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Acl(Vec<Entry>);

/// What a new inode gets from its directory's default ACL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Inherited {
    /// Permission bits (and set-ID and sticky bits) of the new inode.
    pub(super) mode: u32,
    /// Its access ACL, when the default ACL says more than a mode can.
    pub(super) access: Option<Vec<u8>>,
    /// Its default ACL (directories take their parent's).
    pub(super) default: Option<Vec<u8>>,
}

impl Acl {
    /// Decodes an ACL attribute; `None` for bytes that are not one.
    pub(super) fn parse(bytes: &[u8]) -> Option<Acl> {
        if bytes.len() < 4 || !(bytes.len() - 4).is_multiple_of(8) {
            return None;
        }
        if u32::from_le_bytes(bytes[..4].try_into().ok()?) != VERSION {
            return None;
        }
        let entries = bytes[4..]
            .chunks_exact(8)
            .map(|c| Entry {
                tag: u16::from_le_bytes([c[0], c[1]]),
                perm: u16::from_le_bytes([c[2], c[3]]),
                id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        Some(Acl(entries))
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = VERSION.to_le_bytes().to_vec();
        for e in &self.0 {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    /// What an inode created with `mode` (its type's permission bits as
    /// asked, before any umask) in a directory with this default ACL gets,
    /// `dir` when it is a directory: Linux's `posix_acl_create_masq`. The
    /// owner, group (or mask) and other entries are limited to what the
    /// mode asks, and the mode to what they allow.
    pub(super) fn inherit(&self, mode: u32, dir: bool) -> Inherited {
        let mut acl = self.clone();
        let mut bits = mode & 0o777;
        let mut equivalent = true;
        let (mut group_obj, mut mask) = (None, None);
        for (i, e) in acl.0.iter_mut().enumerate() {
            match e.tag {
                USER_OBJ => {
                    e.perm &= ((bits >> 6) & 7) as u16;
                    bits &= ((e.perm as u32) << 6) | !0o700;
                }
                USER | GROUP => equivalent = false,
                GROUP_OBJ => group_obj = Some(i),
                OTHER => {
                    e.perm &= (bits & 7) as u16;
                    bits &= (e.perm as u32) | !0o007;
                }
                MASK => {
                    mask = Some(i);
                    equivalent = false;
                }
                _ => {}
            }
        }
        if let Some(i) = mask.or(group_obj) {
            let e = &mut acl.0[i];
            e.perm &= ((bits >> 3) & 7) as u16;
            bits &= ((e.perm as u32) << 3) | !0o070;
        }
        Inherited {
            mode: (mode & !0o777) | (bits & 0o777),
            access: (!equivalent).then(|| acl.encode()),
            default: dir.then(|| self.encode()),
        }
    }
}

impl Acl {
    /// The permission bits an access ACL gives the mode: owner, group
    /// class (the mask when there is one) and other.
    pub(super) fn mode_bits(&self) -> u32 {
        let perm = |tag: u16| {
            self.0
                .iter()
                .find(|e| e.tag == tag)
                .map(|e| (e.perm & 7) as u32)
        };
        let group = perm(MASK).or(perm(GROUP_OBJ)).unwrap_or(0);
        (perm(USER_OBJ).unwrap_or(0) << 6) | (group << 3) | perm(OTHER).unwrap_or(0)
    }

    /// Whether a mode says all this ACL says (owner, group, other only).
    pub(super) fn is_mode(&self) -> bool {
        self.0
            .iter()
            .all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
    }

    /// The access ACL after a chmod to `mode`: the owner, group class (the
    /// mask when there is one) and other entries take the mode's bits
    /// (Linux's `posix_acl_chmod`).
    pub(super) fn chmod(&self, mode: u32) -> Acl {
        let mut acl = self.clone();
        let has_mask = acl.0.iter().any(|e| e.tag == MASK);
        for e in acl.0.iter_mut() {
            match e.tag {
                USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
                MASK => e.perm = ((mode >> 3) & 7) as u16,
                GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
                OTHER => e.perm = (mode & 7) as u16,
                _ => {}
            }
        }
        acl
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl(entries
            .iter()
            .map(|&(tag, perm, id)| Entry { tag, perm, id })
            .collect())
    }

    #[test]
    fn acls_round_trip_and_bad_bytes_are_refused() {
        let a = acl(&[
            (USER_OBJ, 7, u32::MAX),
            (GROUP_OBJ, 5, u32::MAX),
            (OTHER, 0, u32::MAX),
        ]);
        assert_eq!(Acl::parse(&a.encode()), Some(a.clone()));
        assert_eq!(Acl::parse(&[2, 0, 0]), None);
        let mut wrong = a.encode();
        wrong[0] = 1;
        assert_eq!(Acl::parse(&wrong), None);
        assert_eq!(Acl::parse(&a.encode()[..11]), None);
    }

    #[test]
    fn a_new_inode_takes_the_default_acl_masked_by_its_mode() {
        // setfacl -d -m u::rwx,g::r-x,o::---,u:1000:rwx,m::rwx
        let default = acl(&[
            (USER_OBJ, 7, u32::MAX),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, u32::MAX),
            (MASK, 7, u32::MAX),
            (OTHER, 0, u32::MAX),
        ]);
        // A file created 0666: the mask limits the group class to rw-.
        let f = default.inherit(0o100666, false);
        assert_eq!(f.mode, 0o100660);
        let access = Acl::parse(f.access.as_deref().unwrap()).unwrap();
        assert_eq!(
            access,
            acl(&[
                (USER_OBJ, 6, u32::MAX),
                (USER, 7, 1000),
                (GROUP_OBJ, 5, u32::MAX),
                (MASK, 6, u32::MAX),
                (OTHER, 0, u32::MAX),
            ])
        );
        assert_eq!(f.default, None);
        // A directory also takes the default ACL as its own.
        let d = default.inherit(0o40777, true);
        assert_eq!(d.mode, 0o40770);
        assert_eq!(d.default, Some(default.encode()));
        // Only the three base entries: a mode says it all.
        let plain = acl(&[
            (USER_OBJ, 7, u32::MAX),
            (GROUP_OBJ, 0, u32::MAX),
            (OTHER, 5, u32::MAX),
        ]);
        let p = plain.inherit(0o100666, false);
        assert_eq!((p.mode, p.access), (0o100604, None));
    }

    #[test]
    fn an_access_acl_gives_the_mode_its_bits() {
        let a = acl(&[
            (USER_OBJ, 6, u32::MAX),
            (USER, 4, 65534),
            (GROUP_OBJ, 0, u32::MAX),
            (MASK, 4, u32::MAX),
            (OTHER, 0, u32::MAX),
        ]);
        assert_eq!((a.mode_bits(), a.is_mode()), (0o640, false));
        let plain = acl(&[
            (USER_OBJ, 7, u32::MAX),
            (GROUP_OBJ, 5, u32::MAX),
            (OTHER, 1, u32::MAX),
        ]);
        assert_eq!((plain.mode_bits(), plain.is_mode()), (0o751, true));
    }

    #[test]
    fn chmod_sets_the_owner_mask_and_other_entries() {
        let a = acl(&[
            (USER_OBJ, 7, u32::MAX),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, u32::MAX),
            (MASK, 7, u32::MAX),
            (OTHER, 5, u32::MAX),
        ]);
        assert_eq!(
            a.chmod(0o640),
            acl(&[
                (USER_OBJ, 6, u32::MAX),
                (USER, 7, 1000),
                (GROUP_OBJ, 5, u32::MAX),
                (MASK, 4, u32::MAX),
                (OTHER, 0, u32::MAX),
            ])
        );
    }
}
