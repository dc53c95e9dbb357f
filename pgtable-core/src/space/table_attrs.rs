//! Table-level (hierarchical) attributes: restrictions a table entry puts
//! on everything mapped below it.

/// Restrictions a table entry applies to every mapping below it.
///
/// A format encodes the flags it can and ignores the rest (x86 has no
/// privileged-only or user-only execute-never at the table level: its XD
/// bit, which stops both, is used only when both flags are asked for).
///
/// Both architectures combine the rights of every level of a walk:
///
/// - **arm64** (Arm ARM D8.4.2 "Hierarchical control of data access
///   permissions" and D8.4.3 for instruction access): a table descriptor's
///   `APTable[0]` (bit 61) removes EL0 access, `APTable[1]` (bit 62) write
///   access, `UXNTable` (bit 60) EL0 and `PXNTable` (bit 59) EL1 execution
///   for every later level. Linux sets `PXNTable` on the tables of user
///   address spaces (`PMD_TABLE_PXN`, `PUD_TABLE_PXN`, …) so the kernel can
///   never execute user memory, and keeps kernel tables out of EL0's reach.
/// - **x86-64** (Intel SDM Vol. 3A 4.6.1 "Determination of access
///   rights"): an access is a user-mode access right only if U/S is 1 in
///   *every* paging-structure entry of the walk, writable only if R/W is 1
///   in every one, and executable only if XD is 0 in every one. Linux
///   builds user tables with `_PAGE_TABLE` (U/S set) and kernel tables with
///   `_KERNPG_TABLE` (U/S clear).
///
/// An [`AddressSpace`](crate::AddressSpace) links every new table with its
/// [`TableAttrs`] ([`AddressSpace::set_table_attrs`](crate::AddressSpace::set_table_attrs));
/// the format encodes them ([`Format::table_entry_attrs`](crate::Format::table_entry_attrs))
/// and tells the simulated walker what an entry restricts
/// ([`Format::table_limits`](crate::Format::table_limits)).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct TableAttrs {
    bits: u8,
}

impl TableAttrs {
    /// No user (EL0, CPL 3) access below (arm64 `APTable[0]`; x86 U/S
    /// clear).
    pub const NO_USER: u8 = 1 << 0;
    /// No write access below (arm64 `APTable[1]`; x86 R/W clear).
    pub const READ_ONLY: u8 = 1 << 1;
    /// No user instruction fetches below (arm64 `UXNTable`).
    pub const UXN: u8 = 1 << 2;
    /// No privileged instruction fetches below (arm64 `PXNTable`).
    pub const PXN: u8 = 1 << 3;

    /// No restriction: what [`Format::table_entry`](crate::Format::table_entry)
    /// builds.
    pub const NONE: TableAttrs = TableAttrs::new(0);
    /// The tables of a user address space: the kernel may not execute
    /// below them (Linux arm64 `PMD_TABLE_PXN`; on x86 U/S set, which is
    /// what user access needs at every level).
    pub const USER: TableAttrs = TableAttrs::new(TableAttrs::PXN);
    /// The tables of the kernel half: no user access and no user
    /// execution below them (arm64 `APTable[0]` and `UXNTable`; x86 U/S
    /// clear, Linux `_KERNPG_TABLE`).
    pub const KERNEL: TableAttrs = TableAttrs::new(TableAttrs::NO_USER | TableAttrs::UXN);

    /// The attributes with the given flag bits.
    pub const fn new(bits: u8) -> TableAttrs {
        TableAttrs { bits }
    }

    /// The flag bits.
    pub const fn bits(self) -> u8 {
        self.bits
    }

    /// Both sets of restrictions (what a walk through two tables gets).
    pub const fn union(self, other: TableAttrs) -> TableAttrs {
        TableAttrs::new(self.bits | other.bits)
    }

    /// Whether user access is removed.
    pub const fn no_user(self) -> bool {
        self.bits & TableAttrs::NO_USER != 0
    }

    /// Whether write access is removed.
    pub const fn read_only(self) -> bool {
        self.bits & TableAttrs::READ_ONLY != 0
    }

    /// Whether user instruction fetches are removed.
    pub const fn uxn(self) -> bool {
        self.bits & TableAttrs::UXN != 0
    }

    /// Whether privileged instruction fetches are removed.
    pub const fn pxn(self) -> bool {
        self.bits & TableAttrs::PXN != 0
    }

    /// The fault the restrictions raise for `access`, if any (checked
    /// after the leaf's own rights, in the order the leaf checks them).
    pub const fn check(self, access: crate::Access) -> Result<(), crate::AccessFault> {
        if access.user && self.no_user() {
            return Err(crate::AccessFault::Privilege);
        }
        if access.write && self.read_only() {
            return Err(crate::AccessFault::Write);
        }
        if access.exec && (if access.user { self.uxn() } else { self.pxn() }) {
            return Err(crate::AccessFault::Exec);
        }
        Ok(())
    }
}
