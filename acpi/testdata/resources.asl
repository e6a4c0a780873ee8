/*
 * Resource descriptor vectors for acpi's encoder: resources_test.go builds
 * the same templates with the Go API and compares the bytes after the
 * header. Compile: iasl -on resources.asl.
 */
DefinitionBlock ("", "DSDT", 2, "HPCVMM", "RES", 1)
{
    Name (R000, ResourceTemplate ()
    {
        WordBusNumber (ResourceProducer, MinFixed, MaxFixed, PosDecode,
            0x0000, 0x0000, 0x00FF, 0x0000, 0x0100,,,)
        IO (Decode16, 0x0CF8, 0x0CF8, 0x01, 0x08,)
        IO (Decode10, 0x0060, 0x0064, 0x04, 0x01,)
        WordIO (ResourceProducer, MinFixed, MaxFixed, PosDecode, EntireRange,
            0x0000, 0x1000, 0xFFFF, 0x0000, 0xF000,,, , TypeStatic, DenseTranslation)
        DWordIO (ResourceProducer, MinFixed, MaxFixed, PosDecode, EntireRange,
            0x00000000, 0x00001000, 0x0000FFFF, 0x00000000, 0x0000F000,,, , TypeStatic, DenseTranslation)
        DWordMemory (ResourceProducer, PosDecode, MinFixed, MaxFixed, NonCacheable, ReadWrite,
            0x00000000, 0xC0000000, 0xFEBFFFFF, 0x00000000, 0x3EC00000,,, , AddressRangeMemory, TypeStatic)
        DWordMemory (ResourceProducer, PosDecode, MinFixed, MaxFixed, Cacheable, ReadOnly,
            0x00000000, 0x80000000, 0x8FFFFFFF, 0x00000000, 0x10000000,,, , AddressRangeMemory, TypeStatic)
        QWordMemory (ResourceProducer, PosDecode, MinFixed, MaxFixed, Cacheable, ReadWrite,
            0x0000000000000000, 0x0000008000000000, 0x000000FFFFFFFFFF, 0x0000000000000000, 0x0000008000000000,,, , AddressRangeMemory, TypeStatic)
        QWordMemory (ResourceProducer, PosDecode, MinFixed, MaxFixed, Prefetchable, ReadWrite,
            0x0000000000000000, 0x0000010000000000, 0x000001FFFFFFFFFF, 0x0000000000000000, 0x0000010000000000,,, , AddressRangeMemory, TypeStatic)
        QWordMemory (ResourceConsumer, PosDecode, MinFixed, MaxFixed, WriteCombining, ReadWrite,
            0x0000000000000000, 0x00000000B0000000, 0x00000000BFFFFFFF, 0x0000000000000000, 0x0000000010000000,,, , AddressRangeMemory, TypeStatic)
        Memory32Fixed (ReadWrite, 0xB0000000, 0x10000000,)
        Memory32Fixed (ReadOnly, 0xFED00000, 0x00000004,)
        Interrupt (ResourceConsumer, Edge, ActiveHigh, Exclusive, ,,) {5}
        Interrupt (ResourceConsumer, Level, ActiveLow, Shared, ,,) {16, 17, 0x100}
        Interrupt (ResourceProducer, Level, ActiveHigh, ExclusiveAndWake, ,,) {0xFFFFFFFF}
        IRQNoFlags () {4}
        IRQNoFlags () {1, 12}
    })
    Name (R001, ResourceTemplate ()
    {
        IO (Decode16, 0x03F8, 0x03F8, 0x00, 0x08,)
        IRQNoFlags () {4}
    })
}
