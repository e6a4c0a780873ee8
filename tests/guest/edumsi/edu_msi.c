// SPDX-License-Identifier: GPL-2.0
/*
 * edu_msi: the guest side of hpcvmm's MSI passthrough scenario. It binds to
 * QEMU's edu device (1234:11e8) passed through by hpcvmm, enables its one
 * MSI vector, raises `raise` interrupts through the device's raise-irq
 * register one at a time, and counts the ones that arrive. The outcome is
 * in /sys/module/edu_msi/parameters/ (msi, counted, raised, timeouts) and,
 * while the driver is bound, /proc/interrupts ("edu_msi"). See
 * tests/guest/init (pt_edu_msi).
 */
#include <linux/completion.h>
#include <linux/interrupt.h>
#include <linux/module.h>
#include <linux/pci.h>

#define EDU_ID 0x00
#define EDU_IRQ_STATUS 0x24
#define EDU_IRQ_RAISE 0x60
#define EDU_IRQ_ACK 0x64

static int raise = 8;
module_param(raise, int, 0444);
MODULE_PARM_DESC(raise, "interrupts to raise at probe");
static int msi;
module_param(msi, int, 0444);
MODULE_PARM_DESC(msi, "1 when the device's MSI was enabled");
static int counted;
module_param(counted, int, 0444);
MODULE_PARM_DESC(counted, "MSIs received whose status was the raised value");
static int raised;
module_param(raised, int, 0444);
MODULE_PARM_DESC(raised, "interrupts raised");
static int timeouts;
module_param(timeouts, int, 0444);
MODULE_PARM_DESC(timeouts, "raised interrupts that did not arrive within 2 s");

struct edu {
	void __iomem *bar;
	int irq;
	struct completion done;
	u32 want;
};

static irqreturn_t edu_irq(int irq, void *data)
{
	struct edu *e = data;
	u32 st = ioread32(e->bar + EDU_IRQ_STATUS);

	if (!st)
		return IRQ_NONE;
	iowrite32(st, e->bar + EDU_IRQ_ACK);
	if (st == e->want)
		counted++;
	complete(&e->done);
	return IRQ_HANDLED;
}

static int edu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct edu *e;
	int err, i, irq;

	e = devm_kzalloc(&pdev->dev, sizeof(*e), GFP_KERNEL);
	if (!e)
		return -ENOMEM;
	init_completion(&e->done);
	err = pcim_enable_device(pdev);
	if (err)
		return err;
	err = pcim_iomap_regions(pdev, 1, "edu_msi");
	if (err)
		return err;
	e->bar = pcim_iomap_table(pdev)[0];
	/* An MSI is a memory write by the device: no bus mastering, no MSI. */
	pci_set_master(pdev);
	err = pci_alloc_irq_vectors(pdev, 1, 1, PCI_IRQ_MSI);
	if (err < 0) {
		dev_err(&pdev->dev, "edu_msi: no MSI vector: %d\n", err);
		return err;
	}
	msi = pdev->msi_enabled;
	irq = pci_irq_vector(pdev, 0);
	e->irq = irq;
	err = request_irq(irq, edu_irq, 0, "edu_msi", e);
	if (err) {
		pci_free_irq_vectors(pdev);
		return err;
	}
	for (i = 0; i < raise; i++) {
		reinit_completion(&e->done);
		e->want = 0x100 + i;
		iowrite32(e->want, e->bar + EDU_IRQ_RAISE);
		raised++;
		if (!wait_for_completion_timeout(&e->done, 2 * HZ))
			timeouts++;
	}
	dev_info(&pdev->dev, "edu_msi: id %#x msi %d raised %d counted %d timeouts %d\n",
		 ioread32(e->bar + EDU_ID), msi, raised, counted, timeouts);
	pci_set_drvdata(pdev, e);
	return 0;
}

static void edu_remove(struct pci_dev *pdev)
{
	struct edu *e = pci_get_drvdata(pdev);

	free_irq(e->irq, e);
	pci_free_irq_vectors(pdev);
}

static const struct pci_device_id edu_ids[] = {
	{ PCI_DEVICE(0x1234, 0x11e8) },
	{ }
};
MODULE_DEVICE_TABLE(pci, edu_ids);

static struct pci_driver edu_driver = {
	.name = "edu_msi",
	.id_table = edu_ids,
	.probe = edu_probe,
	.remove = edu_remove,
};
module_pci_driver(edu_driver);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("MSI test driver for QEMU's edu device (hpcvmm integration tests)");
