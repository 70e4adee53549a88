/*
 * unicode.c — strict UTF-8 and code point classes for the tokenizer.
 *
 * Well-formed UTF-8 follows the Unicode standard's table 3-7: the second byte's range depends on
 * the lead byte, which rules out overlong forms, surrogates and code points above U+10FFFF.
 */
#include "unicode.h"

/*
 * The class of a code point: ASCII from a direct table, the rest by binary search over the
 * generated run table (about 1,600 runs).
 */
cai_unicode_class
cai_unicode_class_of(uint32_t cpt)
{
	int			lo = 0;
	int			hi = cai_unicode_n_runs - 1;

	if (cpt < 0x80)
	{
		if ((cpt >= 'a' && cpt <= 'z') || (cpt >= 'A' && cpt <= 'Z'))
			return CAI_UNICODE_LETTER;
		if (cpt >= '0' && cpt <= '9')
			return CAI_UNICODE_NUMBER;
		if (cpt == ' ' || (cpt >= 0x09 && cpt <= 0x0D))
			return CAI_UNICODE_SPACE;
		return CAI_UNICODE_OTHER;
	}
	if (cpt > 0x10FFFF)
		return CAI_UNICODE_OTHER;

	/* find the last run whose first code point is <= cpt */
	while (lo < hi)
	{
		int			mid = (lo + hi + 1) / 2;

		if ((cai_unicode_runs[mid] >> 2) <= cpt)
			lo = mid;
		else
			hi = mid - 1;
	}
	return (cai_unicode_class) (cai_unicode_runs[lo] & 3);
}

/*
 * For a lead byte: the sequence length (0 if the byte cannot start a sequence) and the range
 * its second byte must lie in.
 */
static int
utf8_lead(unsigned char c, unsigned char *lo2, unsigned char *hi2)
{
	*lo2 = 0x80;
	*hi2 = 0xBF;
	if (c < 0x80)
		return 1;
	if (c < 0xC2)
		return 0;				/* continuation byte, or overlong C0/C1 */
	if (c < 0xE0)
		return 2;
	if (c < 0xF0)
	{
		if (c == 0xE0)
			*lo2 = 0xA0;		/* no overlong 3-byte forms */
		else if (c == 0xED)
			*hi2 = 0x9F;		/* no surrogates */
		return 3;
	}
	if (c < 0xF5)
	{
		if (c == 0xF0)
			*lo2 = 0x90;		/* no overlong 4-byte forms */
		else if (c == 0xF4)
			*hi2 = 0x8F;		/* nothing above U+10FFFF */
		return 4;
	}
	return 0;
}

int
cai_utf8_decode(const unsigned char *s, size_t len, uint32_t *cpt)
{
	unsigned char lo2;
	unsigned char hi2;
	int			n;
	uint32_t	v;

	if (len == 0)
		return 0;
	n = utf8_lead(s[0], &lo2, &hi2);
	if (n == 0 || (size_t) n > len)
		return 0;
	if (n == 1)
	{
		*cpt = s[0];
		return 1;
	}
	if (s[1] < lo2 || s[1] > hi2)
		return 0;
	v = s[0] & (0x7F >> n);
	for (int i = 1; i < n; i++)
	{
		if ((s[i] & 0xC0) != 0x80)
			return 0;
		v = (v << 6) | (s[i] & 0x3F);
	}
	*cpt = v;
	return n;
}

bool
cai_utf8_incomplete(const unsigned char *s, size_t len)
{
	unsigned char lo2;
	unsigned char hi2;
	int			n;

	if (len == 0)
		return false;
	n = utf8_lead(s[0], &lo2, &hi2);
	if (n <= 1 || len >= (size_t) n)
		return false;
	if (len >= 2 && (s[1] < lo2 || s[1] > hi2))
		return false;
	for (size_t i = 2; i < len; i++)
		if ((s[i] & 0xC0) != 0x80)
			return false;
	return true;
}

int
cai_utf8_encode(uint32_t cpt, char *out)
{
	if (cpt < 0x80)
	{
		out[0] = (char) cpt;
		return 1;
	}
	if (cpt < 0x800)
	{
		out[0] = (char) (0xC0 | (cpt >> 6));
		out[1] = (char) (0x80 | (cpt & 0x3F));
		return 2;
	}
	if (cpt < 0x10000)
	{
		out[0] = (char) (0xE0 | (cpt >> 12));
		out[1] = (char) (0x80 | ((cpt >> 6) & 0x3F));
		out[2] = (char) (0x80 | (cpt & 0x3F));
		return 3;
	}
	out[0] = (char) (0xF0 | (cpt >> 18));
	out[1] = (char) (0x80 | ((cpt >> 12) & 0x3F));
	out[2] = (char) (0x80 | ((cpt >> 6) & 0x3F));
	out[3] = (char) (0x80 | (cpt & 0x3F));
	return 4;
}
