package santa

import "github.com/santa-offload/santa/api"

// Match is a condition: the request payload carries pattern at offset.
func Match(offset int, pattern []byte) api.Condition {
	return api.Condition{Offset: uint32(offset), Pattern: pattern}
}

// Put is a processor writing template at replyOffset.
func Put(replyOffset int, template []byte) api.Processor {
	return api.Processor{Kind: api.KindPut, ReplyOffset: uint32(replyOffset), Template: template}
}

// Copy is a processor copying length request bytes from srcOffset to replyOffset.
func Copy(replyOffset, srcOffset, length int) api.Processor {
	return api.Processor{Kind: api.KindCopy, ReplyOffset: uint32(replyOffset), SrcOffset: uint32(srcOffset), Length: uint32(length)}
}
