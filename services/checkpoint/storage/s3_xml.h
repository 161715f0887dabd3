/*
 * s3_xml: the little XML S3 needs. Responses are small documents of known
 * shape (<InitiateMultipartUploadResult>, <ListPartsResult>, <Error>, ...);
 * we only ever need "the text of element X", in order, possibly inside
 * element Y. A careful scanner does that without an XML library: it skips
 * the prolog, comments and CDATA-free markup, matches whole tag names
 * (so <Key> does not match <KeyMarker>), and decodes the five predefined
 * entities and numeric character references in text.
 */
#ifndef STK_S3_XML_H
#define STK_S3_XML_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct strbuf;

/* A window into a document: [data, data + len). */
struct s3_xml_span {
  const char *data;
  size_t len;
};

/* Finds the next element named tag in doc at or after *cursor (an offset;
 * start at 0). On success sets ret_inner to its content (between the start
 * and end tags; empty for <tag/>), advances *cursor past it and returns
 * true. False when there is none or the document is malformed there. */
bool s3_xml_next(struct s3_xml_span doc, const char *tag, size_t *cursor,
                 struct s3_xml_span *ret_inner);

/* The decoded text of the first element named tag, or NULL (also on
 * malformed text). Free with free(). */
char *s3_xml_text(struct s3_xml_span doc, const char *tag);

/* Decodes entities of a text span; NULL on a bad entity or out of memory. */
char *s3_xml_decode(struct s3_xml_span text);

/* Parses an ISO 8601 UTC time as S3 writes it ("2010-11-10T20:48:33.000Z";
 * fraction optional, "Z" or "+hh:mm"/"-hh:mm") into milliseconds since the
 * epoch. 0 or STK_EINVAL. */
int s3_xml_time_ms(const char *text, int64_t *ret_ms);

/* Appends s with & < > " ' escaped. */
void s3_xml_escape(struct strbuf *sb, const char *s);

#endif
