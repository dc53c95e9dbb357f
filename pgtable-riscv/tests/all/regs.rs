//! `satp` values (privileged spec, "Supervisor Address Translation and
//! Protection (satp) Register"): MODE values, the checked `Satp`, ASIDLEN
//! from the probe's read-back.

use pgtable_core::PhysAddr;
use pgtable_riscv::regs::{asid_bits_from_probe, Satp, SatpError, SatpMode};
use pgtable_riscv::{satp_value, Asid, RiscvPaging, Sv39, Sv48, Sv57};

#[test]
fn asidlen_counts_the_ones_from_the_lowest_asid_bit() {
    assert_eq!(asid_bits_from_probe(0), 0);
    assert_eq!(asid_bits_from_probe(8 << 60 | 0xffff << 44), 16);
    assert_eq!(asid_bits_from_probe(9 << 60 | 0xff << 44 | 0xfff_ffff), 8);
    // Bits above a zero cannot be implemented: not counted.
    assert_eq!(asid_bits_from_probe(0b1011 << 44), 2);
    // MODE and PPN bits are not ASID bits.
    assert_eq!(asid_bits_from_probe(!(0xffff << 44)), 0);
    let bits = asid_bits_from_probe(0x1ff << 44);
    assert!(Asid::new(0x1ff, bits).is_ok() && Asid::new(0x200, bits).is_err());
}

#[test]
fn modes_match_the_formats_and_round_trip() {
    for (m, levels, format_mode) in [
        (SatpMode::Sv39, 3, Sv39::SATP_MODE),
        (SatpMode::Sv48, 4, Sv48::SATP_MODE),
        (SatpMode::Sv57, 5, Sv57::SATP_MODE),
    ] {
        assert_eq!(m.field(), format_mode);
        assert_eq!(SatpMode::for_levels(levels), Some(m));
        assert_eq!(m.levels(), levels);
        assert_eq!(SatpMode::from_field(m.field()), Some(m));
    }
    assert_eq!(RiscvPaging::<4, 3>::SATP_MODE, SatpMode::Sv48.field());
    assert_eq!(SatpMode::from_field(0), Some(SatpMode::Bare));
    for reserved in (1..8).chain(11..16) {
        assert_eq!(SatpMode::from_field(reserved), None);
    }
    assert_eq!(SatpMode::for_levels(2), None);
}

#[test]
fn satp_fields_decode_what_new_encodes() {
    let a = Asid::new(0xbeef, 16).unwrap();
    let s = Satp::new(SatpMode::Sv57, a, PhysAddr(0x00ab_cdef_0000)).unwrap();
    assert_eq!(s.bits(), satp_value(10, a, 0x00ab_cdef_0000));
    assert_eq!(s.mode(), Some(SatpMode::Sv57));
    assert_eq!(s.asid(), 0xbeef);
    assert_eq!(s.root(), PhysAddr(0x00ab_cdef_0000));
    assert_eq!(Satp::from_bits(s.bits()), s);
    assert_eq!(Satp::from_bits(5 << 60).mode(), None);
    assert_eq!(Satp::BARE.mode(), Some(SatpMode::Bare));
}

#[test]
fn satp_refuses_bad_roots_and_fields_under_bare() {
    let z = Asid::ZERO;
    assert_eq!(
        Satp::new(SatpMode::Sv39, z, PhysAddr(0x8000_0800)),
        Err(SatpError::Unaligned(PhysAddr(0x8000_0800)))
    );
    let high = PhysAddr(1 << 56);
    assert_eq!(
        Satp::new(SatpMode::Sv39, z, high),
        Err(SatpError::RootTooHigh(high))
    );
    assert_eq!(
        Satp::new(SatpMode::Bare, Asid::new(1, 16).unwrap(), PhysAddr(0)),
        Err(SatpError::BareWithFields)
    );
    assert_eq!(
        Satp::new(SatpMode::Bare, z, PhysAddr(0x1000)),
        Err(SatpError::BareWithFields)
    );
    assert_eq!(Satp::new(SatpMode::Bare, z, PhysAddr(0)), Ok(Satp::BARE));
}
